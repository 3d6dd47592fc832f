// The sample publisher configuration. Every key is described in docs/config.md.
module.exports = {
    // The change bucket. Without redisUrl, `changefeed serve` runs an embedded redis-server
    // under stateDir (a unix socket, .changefeed/redis.sock next to this file).
    bucket: {
        // redisUrl: "redis://127.0.0.1:6379/0",
        name: "changefeed",
        partitions: 1, // streams the log is split into (a power of two; fixed at creation)
        poolSize: 64,  // Redis connections the requests share
        poolTimeout: 5, // seconds a request waits for one, then 503 Overloaded
    },
    maxAge: 3600, // seconds a change item is kept in the bucket
    maxItems: 0,  // most items kept (the oldest go first); 0: no limit
    stateDir: ".changefeed",
    server: {
        host: "127.0.0.1",
        port: 8080,
        maxConnections: 10000,        // in total (lowered to fit the open-file limit)
        maxConnectionsPerClient: 1000, // from one IP address (behind a proxy: maxConnections)
        idleTimeout: 75,              // seconds without a request in progress, then closed
        bodyTimeout: 10,              // seconds a request body may take (else 408)
    },
    feed: {
        consumers: [],          // feed consumers whose cursors the publisher may store
        cursorSetMaxAge: 604800, // seconds a stored cursor set lives after its last store
        maxCursorSets: 16,      // cursor sets per consumer
    },
    resources: [
        {resource: "vm", subResources: ["nic", "alias", "state"], bootstrapRoute: "/vms"},
        {resource: "network", subResources: ["ips", "name"], bootstrapRoute: "/networks"},
    ],
    trace: {
        items: 10000, // changes each publisher traces for `changefeed trace` (0: none)
        maxAge: 600,  // seconds a change stays traced (0: no age limit)
    },
    limits: {
        registrationBytes: 65536, // largest registration frame accepted (else 1009)
        registrationTimeout: 10,  // seconds a new socket has to send its registration
        pageSize: 100,            // bootstrap page size without ?limit=
        maxPageSize: 1000,        // largest ?limit=
        window: 10000,            // items each publisher keeps for listeners catching up
        sendBuffer: 1048576,      // bytes queued to one listener before it counts as slow
        pingInterval: 20,         // seconds between websocket pings (no pong: disconnected)
        results: 100,             // items in an events reply / feed response by default
        maxResults: 1000,         // largest max_results / pagesizehint honoured
        wait: 10,                 // seconds an events long poll waits by default
        maxWait: 60,              // longest wait of a long poll
    },
};
