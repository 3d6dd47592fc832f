"""Where the figures go: a JSON file, the tables of docs/benchmarks.md (between two markers, so the
prose around them stays), PNG charts where a curve says more than a table, and the terminal."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- bench:results:begin -->", "<!-- bench:results:end -->"


def _number(value: float) -> str:
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return str(value)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:,.1f}"
    return f"{value:,.2f}"


def _met(check: dict[str, Any]) -> str:
    met = {True: "**met**", False: "**missed**", None: "—"}[check["met"]]
    return f"{met} ({check['note']})" if check.get("note") else met


def _cells(check: dict[str, Any], *, labels: bool = False) -> list[str]:
    """A check's figure, baseline, ratio, target and verdict, as table cells (with the figures'
    labels when `labels`)."""
    figure, base = check["figure"], check["baseline"]
    sides = [f"{side['label']}: " * labels + f"{_number(side['value'])} {side['unit']}"
             for side in (figure, base)]
    return [*sides, f"{check['ratio']}x", check["target"], _met(check)]


def _command(scenario: dict[str, Any]) -> str:
    revision = f" at `{scenario['revision']}`" if scenario.get("revision") else ""
    load = (f"; load average at its start {scenario['load_at_start']}"
            if scenario.get("load_at_start") else "")
    return f"Command: `{scenario['command']}`{revision} ({scenario.get('measured', '')}{load})"


def _cpu(cpu: dict[str, dict[str, float]]) -> str:
    runs = []
    for run, sides in cpu.items():
        shares = ", ".join(f"{side} {share:.2f}" for side, share in sides.items())
        runs.append(f"{run}: {shares}")
    return "; ".join(runs)


def lines(scenario: dict[str, Any]) -> list[str]:
    """The terminal lines of one scenario."""
    if scenario.get("error"):
        return [f"{scenario['id']}  FAILED: {scenario['error'].splitlines()[0]}"]
    out = [f"{scenario['id']}  {scenario['title']}"]
    for check in scenario["checks"]:
        figure, base, ratio, target, met = _cells(check)
        out.append(f"    {check['what']}: {figure} vs {base} = {ratio}  target {target}: "
                   + met.replace("*", ""))
    if scenario.get("cpu"):
        out.append(f"    cores used: {_cpu(scenario['cpu'])}")
    return out


def markdown(run: dict[str, Any]) -> str:
    """The generated part of docs/benchmarks.md."""
    machine = run["machine"]
    out = [
        BEGIN,
        "",
        f"Latest run: {run['started']} ({run['seconds'] / 60:.1f} min), command "
        f"`{run['command']}`, at `{', '.join(run.get('revisions', [])) or 'n/a'}`.",
        "",
        f"Machine: {machine['cores']} cores ({machine['cpu']}), {machine['memory_gib']} GiB, "
        f"Linux {machine['kernel']}, Python {machine['python']}, {machine['redis']}, "
        f"{machine['nats_server']}; load average at start {machine['load_average']}; "
        f"publisher event loop: {', '.join(run.get('publisher_loop', [])) or 'n/a'}, "
        f"baselines' event loop: {', '.join(run.get('baseline_loop', [])) or 'n/a'}. "
        "Libraries: " + ", ".join(f"{k} {v}" for k, v in machine["libraries"].items()) + ".",
        "",
        "| # | scenario | figure | baseline | ratio | target | |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, scenario in run["scenarios"].items():
        if scenario.get("error"):
            first = scenario["error"].splitlines()[0][:100]
            out.append(f"| {key} | {scenario['title']} | failed: {first} | | | | |")
            continue
        for check in scenario["checks"]:
            out.append("| " + " | ".join([key, check["what"], *_cells(check)]) + " |")
    for key, scenario in run["scenarios"].items():
        out += ["", f"### {key}: {scenario['title']}", ""]
        if scenario.get("error"):
            out += ["```", scenario["error"], "```"]
            continue
        if scenario.get("command"):
            out += [_command(scenario), ""]
        out += ["| what | figure | baseline | ratio | target | |", "|---|---|---|---|---|---|"]
        for check in scenario["checks"]:
            out.append("| " + " | ".join([check["what"], *_cells(check, labels=True)]) + " |")
        if scenario.get("cpu"):
            out += ["", f"Cores used while measured (CPU s / wall s): {_cpu(scenario['cpu'])}."]
        for note in scenario.get("notes", []):
            out += ["", note]
        for chart in scenario.get("charts", []):
            out += ["", f"![{key}]({chart})"]
    out += ["", END]
    return "\n".join(out)


def write_docs(path: Path, run: dict[str, Any]) -> None:
    """Replace the generated part of `path` (or append it when the markers are missing)."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    generated = markdown(run)
    if BEGIN in text and END in text:
        before, rest = text.split(BEGIN, 1)
        after = rest.split(END, 1)[1]
        text = before + generated + after
    else:
        text = text.rstrip() + "\n\n" + generated + "\n"
    path.write_text(text)


# --- charts --------------------------------------------------------------------------------


def charts(scenario: dict[str, Any], directory: Path, relative_to: Path) -> list[str]:
    """Draw the charts of a scenario that has curves; the paths, relative to `relative_to`."""
    try:
        import matplotlib
    except ImportError:
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = []
    directory.mkdir(parents=True, exist_ok=True)
    details = scenario.get("details", {})
    key = scenario["id"].lower()
    if "cdf" in details:
        figure, axes = plt.subplots(figsize=(7, 4))
        for name, points in details["cdf"].items():
            if points:
                axes.plot([p[0] for p in points], [p[1] for p in points], label=name)
        axes.set_xscale("log")
        axes.set_xlabel("latency (ms, log scale)")
        axes.set_ylabel("fraction of items")
        axes.set_title(scenario["title"])
        axes.grid(True, which="both", alpha=0.3)
        axes.legend()
        drawn.append(_save(figure, directory / f"bench-{key}-latency.png", plt))
    if "rss_mib" in details:
        figure, axes = plt.subplots(figsize=(7, 4))
        for name, series in details["rss_mib"].items():
            steps = sorted(series, key=int)
            axes.plot([int(s) for s in steps], [series[s] for s in steps], marker="o", label=name)
        axes.set_xlabel("idle connections")
        axes.set_ylabel("server RSS (MiB)")
        axes.set_title(scenario["title"])
        axes.grid(True, alpha=0.3)
        axes.legend()
        drawn.append(_save(figure, directory / f"bench-{key}-rss.png", plt))
    if "rss_series" in details:
        figure, axes = plt.subplots(figsize=(7, 4))
        for name, series in details["rss_series"].items():
            axes.plot([p[0] for p in series], [p[1] / 2**20 for p in series], label=name)
        axes.set_xlabel("seconds into the measured interval")
        axes.set_ylabel("publisher RSS (MiB)")
        axes.set_title(scenario["title"])
        axes.grid(True, alpha=0.3)
        axes.legend()
        drawn.append(_save(figure, directory / f"bench-{key}-rss.png", plt))
    return [str(path.relative_to(relative_to)) if path.is_relative_to(relative_to) else str(path)
            for path in drawn]


def _save(figure: Any, path: Path, plt: Any) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path
