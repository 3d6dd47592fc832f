"""The fault matrix (`python -m faults`) and the nemesis (`python -m faults.nemesis`): real
redis-servers, Sentinels, PostgreSQL and publisher processes under injected faults, judged by one
oracle (oracle.py). Tools run as programs, not installed; their quick variants are tests of
tests/faults/."""
