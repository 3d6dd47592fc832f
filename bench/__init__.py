"""The benchmark suite: `python -m bench` (see docs/benchmarks.md).

Each scenario measures the change feed against a baseline run in the same invocation, on the same
machine, and reports the ratio: absolute figures drift between runs and machines, ratios do not.
"""
