"""Delivery: the tail reads the bucket, the hub fans each entry out to its listeners.

    tail.py      one blocking read loop per process, checked for gaps and rollbacks
    hub.py       the fan-out: routes, slow consumers, resumes
    window.py    the newest log entries, shared by every connection
    coalesce.py  coalesced catch-up of a slow listener that asked for it
    pings.py     one keepalive sweep over every websocket
    trace.py     the per-change delivery trace
"""
