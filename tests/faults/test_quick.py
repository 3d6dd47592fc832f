"""The fault matrix at its quick size, on real redis-servers and publisher processes.

Each test runs one scenario of faults/scenarios.py and fails on what the oracle counts
as a broken guarantee: an acknowledged change lost without a Resync, a change delivered twice
(docs/protocol.md and docs/listener.md promise once per listener, across reconnects), out of
order, or never acknowledged, or an error (an unexpected refusal); and where the fault destroys
acknowledged history (`ANNOUNCED`), on a listener that was never told to bootstrap again.
`python -m faults`
runs the full matrix and writes docs/reliability.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from faults.harness import QUICK
from faults.scenarios import ANNOUNCED, SCENARIOS

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_scenario_keeps_every_acknowledged_change_or_announces_the_loss(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    row = await SCENARIOS[name](QUICK, Path(tmp_path_factory.mktemp("f")))
    total = row.verdict.total
    assert row.verdict.committed > 0, row.summary()
    assert total.received + total.covered > 0, f"nothing was delivered: {row.summary()}"
    if row.verdict.problems():
        pytest.fail(row.summary())
    assert not any(note.startswith("not caught up") for note in row.notes), row.summary()
    if name in ANNOUNCED:
        silent = [who for who, tally in row.verdict.listeners.items() if not tally.resyncs]
        assert not silent, f"history was lost but {silent} never heard: {row.summary()}"
