/** A small typed event emitter (the browser build has no `events` module). */
type Handler = (...args: any[]) => void;

export class Emitter<Events extends { [K in keyof Events]: Handler }> {
    private handlers = new Map<keyof Events, Set<Handler>>();

    on<K extends keyof Events>(event: K, handler: Events[K]): this {
        let set = this.handlers.get(event);
        if (!set) this.handlers.set(event, (set = new Set()));
        set.add(handler);
        return this;
    }

    once<K extends keyof Events>(event: K, handler: Events[K]): this {
        const wrapper = ((...args: unknown[]) => {
            this.off(event, wrapper as Events[K]);
            handler(...args);
        }) as Events[K];
        return this.on(event, wrapper);
    }

    off<K extends keyof Events>(event: K, handler: Events[K]): this {
        this.handlers.get(event)?.delete(handler);
        return this;
    }

    listenerCount<K extends keyof Events>(event: K): number {
        return this.handlers.get(event)?.size ?? 0;
    }

    protected emit<K extends keyof Events>(event: K, ...args: Parameters<Events[K]>): void {
        for (const handler of [...(this.handlers.get(event) ?? [])]) handler(...args);
    }
}
