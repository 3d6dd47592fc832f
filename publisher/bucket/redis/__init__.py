"""The bucket's transport to Redis: connections of any URL (single, Sentinel, Redis Cluster),
the kept connection and its RESP reader, and the embedded redis-server."""
