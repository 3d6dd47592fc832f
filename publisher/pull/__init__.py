"""Pull: the bucket's log answered on request rather than pushed.

    polls.py         `events` long polls and the ZeroEventHub feed
    feed_cursors.py  which cursor each partition of a feed request reads from
    durable.py       durable pull consumers: create, fetch, settle, delete
"""
