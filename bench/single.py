"""P1' (single commits, no batching, at 1, 100 and 1,000 listeners): the server's CPU per delivery
and the commit -> receive p50, ours against the bare broadcast server, in rounds taking turns.

Both sides get the same load from the same driver (`bench.latency.paired_rounds`): one
`ChangeBucket.commit` at a time, paced at 200 a second, each stamped with the time it was due
(`bench.items`), into a private Redis that the server under test tails (the publisher with its
tail, the bare server with `XREAD`). So every change is one tail read and one frame per listener:
the per-item costs that P1's batches of 10 spread over ten items are all paid here. CPU per
delivery is the server's CPU seconds over the measured interval divided by the deliveries due in
it (changes committed x listeners), or by the deliveries made when the server fell behind.
P2 reports the p99 of the same rounds at 100 and 1,000 listeners.
"""

from __future__ import annotations

from typing import Any

from bench.latency import ROUNDS, _median_cores, paired_rounds, paired_timing
from bench.scenario import Check, Context, Figure, Result, spread


def _checks(count: int, runs: dict[str, list[dict[str, Any]]]) -> list[Check]:
    mine, base = runs["publisher"], runs["bare broadcast"]
    checks = []
    for what, key, unit, target, bound, needed in (
        ("server CPU per delivery", "cpu_us_per_delivery", "µs", "<= 0.8x", 0.8, True),
        ("p50 commit -> receive", "p50_ms", "ms", "<= 1.1x", 1.1, count <= 100),
    ):
        ours_m, ours_lo, ours_hi = spread([r[key] for r in mine])
        base_m, base_lo, base_hi = spread([r[key] for r in base])
        ratios = [a[key] / b[key] for a, b in zip(mine, base, strict=True) if b[key]]
        r_m, r_lo, r_hi = spread(ratios or [0.0])
        checks.append(Check(
            f"{what}, {count:,} listener{'s' * (count != 1)}",
            Figure(f"publisher, median of {len(mine)} ({ours_lo:g}..{ours_hi:g})", ours_m, unit),
            Figure(f"bare broadcast, median of {len(base)} ({base_lo:g}..{base_hi:g})", base_m,
                   unit),
            target if needed else "(information)",
            (r_m <= bound) if needed else None,
            note=f"ratio per round {r_lo:.2f}..{r_hi:.2f}, median {r_m:.2f}",
        ))
    return checks


async def single_commits(ctx: Context) -> Result:
    sizes = ctx.size([1, 100, 1000], [1, 20])
    rounds = ctx.size(ROUNDS, 1)
    timing = paired_timing(ctx)
    result = Result("P1S", f"P1': single commits at {timing['rate']:g}/s, "
                           f"{', '.join(f'{s:,}' for s in sizes)} listeners (no batching)")
    result.details = {"rate": timing["rate"], "seconds": timing["duration"], "rounds": rounds}
    for count in sizes:
        runs = await paired_rounds(ctx, count, rounds, timing)
        result.details[str(count)] = {side: [{k: v for k, v in r.items() if k != "cdf"}
                                             for r in rs] for side, rs in runs.items()}
        result.checks += _checks(count, runs)
        result.cpu[f"{count:,} listeners, publisher (median round)"] = _median_cores(
            runs["publisher"])
        result.cpu[f"{count:,} listeners, bare broadcast (median round)"] = _median_cores(
            runs["bare broadcast"])
    return result
