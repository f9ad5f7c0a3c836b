"""The Prometheus scrape config, recording rules and Grafana dashboard under `examples/prometheus/`.

Grafana is not packaged by Debian, so the dashboard is checked for what can be checked without
it: valid JSON of the shape Grafana imports, and every PromQL expression accepted by Prometheus's
own parser (`promtool check rules`) once Grafana's variables are substituted.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "prometheus"
DASHBOARD = EXAMPLES / "grafana-dashboard.json"

# What Grafana substitutes before sending a query to Prometheus.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    "$hostname": ".*",
}


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (Debian package `prometheus`; .ci/prometheus.sh)")
    return path


def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def _substitute(expr: str) -> str:
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    return expr


def test_dashboard_has_the_shape_grafana_imports() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["title"] and dash["uid"]
    assert {i["name"] for i in dash["__inputs"]} == {"DS_PROMETHEUS"}
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {ids}"
    for panel in dash["panels"]:
        assert panel["type"] in {"timeseries", "stat"}, panel["title"]
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}, panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} queries nothing"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
    # Every variable a query uses is one Grafana provides or the dashboard defines.
    defined = {v["name"] for v in dash["templating"]["list"]}
    for expr in _dashboard_exprs():
        for var in re.findall(r"\$(\w+)", expr):
            assert var.startswith("__") or var in defined, f"undefined ${var} in {expr}"


def test_dashboard_queries_and_rules_parse_with_promtool(tmp_path: Path) -> None:
    promtool = _promtool()
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query{i}", "expr": _substitute(e)}
                    for i, e in enumerate(_dashboard_exprs())
                ],
            }
        ]
    }
    # JSON is YAML, so the rules file needs no YAML library.
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(json.dumps(rules))
    for file in (path, EXAMPLES / "zeus-rules.yml"):
        out = subprocess.run(
            [promtool, "check", "rules", str(file)], capture_output=True, text=True
        )
        assert out.returncode == 0, f"{file}:\n{out.stdout}{out.stderr}"


def test_scrape_config_passes_promtool() -> None:
    promtool = _promtool()
    out = subprocess.run(
        [promtool, "check", "config", str(EXAMPLES / "prometheus.yml")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_metric_the_examples_query_is_served_by_the_exporter(exporter: str) -> None:
    """Names in the dashboard and the rules exist in a real scrape (simulated GPU and CPU)."""
    queried = set()
    for expr in [*_dashboard_exprs(), (EXAMPLES / "zeus-rules.yml").read_text()]:
        queried.update(re.findall(r"\bzeus_[a-z_]+\b", expr))
    assert queried, "the examples query no zeus metric"
    deadline = time.monotonic() + 10
    while True:
        with urllib.request.urlopen(f"http://{exporter}/metrics", timeout=10) as r:
            served = set(re.findall(r"^(zeus_[a-z_]+)\{", r.read().decode(), re.MULTILINE))
        if queried <= served or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert queried <= served, f"queried but never served: {sorted(queried - served)}"
