"""Delivery: the tail reads the bucket, the hub fans each entry out to its listeners.

    tail.py      one blocking read loop per process, checked for gaps and rollbacks
    hub.py       the connections and the parts serving them: membership, closing, resets
    fanout.py    one entry or a batch written to the connections it matches
    decision.py  what the fan-out does for one connection (pure)
    lagging.py   who is not live: catching up, coalescing
    waiters.py   the event long polls and catch-ups wait on
    counters.py  what the delivery counts
    window.py    the newest log entries, shared by every connection
    coalesce.py  coalesced catch-up of a slow listener that asked for it
    pings.py     one keepalive sweep over every websocket
    trace.py     the per-change delivery trace
"""
