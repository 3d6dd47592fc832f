"""The nemesis: many faults, overlapping, from a seeded schedule, over a small real system, judged
by one oracle over the whole history (issue 24). `python -m faults.nemesis --help`."""
