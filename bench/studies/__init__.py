"""One-off studies beside the benchmark suite, each run as `python -m bench.studies.NAME` (its
docstring says what it measures): not scenarios of `python -m bench`, their figures are quoted
where they are used (docs/benchmarks.md, docs/scaling.md, docs/postgres.md, docs/sse.md)."""
