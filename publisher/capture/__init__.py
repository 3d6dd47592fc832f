"""Capture: the row changes of an unchanged PostgreSQL service, read from its write-ahead log by
logical replication (`pgoutput`), committed into the bucket exactly once, a transaction at once,
in commit order (docs/capture.md)."""
