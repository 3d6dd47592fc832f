"""deploy/prometheus-rules.yml and deploy/grafana-dashboard.json name only metrics the
publisher exports, with the types Prometheus' conventions give them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

DEPLOY = Path(__file__).parents[2] / "deploy"

def metric_names(expr: str) -> set[str]:
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", "", expr)
    return {n for n in re.findall(r"[a-z_][a-z0-9_]*", expr) if n.startswith("changefeed_")}


async def exported(publisher: Any) -> set[str]:
    async with aiohttp.ClientSession() as http, http.get(publisher.url + "/metrics") as reply:
        text = await reply.text()
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {sample.name for sample in family.samples}
        names.add(family.name)
        if family.type == "counter":  # labelled counters have no sample before their first
            names.add(family.name + "_total")
    return names


async def test_alert_rules_and_dashboard_use_exported_metrics(publisher: Any) -> None:
    names = await exported(publisher)
    rules = yaml.safe_load((DEPLOY / "prometheus-rules.yml").read_text())
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert {"ChangefeedTailLagging", "ChangefeedResyncStorm", "ChangefeedNoListeners"} <= {
        rule["alert"] for rule in alerts
    }
    used = set()
    for rule in alerts:
        used |= metric_names(rule["expr"])
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used |= metric_names(target["expr"])
    assert used and used <= names, used - names
    for name in used:
        assert name.endswith(("_total", "_seconds", "_bytes", "_bucket", "_count", "_sum",
                              "_info", "_items", "_waiting", "_ready", "_draining",
                              "_healthy", "_listeners", "listeners", "_connections")), name
