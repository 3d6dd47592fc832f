"""The bucket's log over its shards (`Log`), its commits and its shards."""
