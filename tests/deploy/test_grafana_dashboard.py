"""deploy/grafana's dashboard asks only for series the server exports.

The exported series are read from a real server's `/metrics`: every family is listed there
(`# TYPE`) from the start, those with labels too, so a query that names a metric the server
never had, or lost in a rename, fails here rather than as an empty panel.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.harness import RunningServer

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "inference-auctions.json"
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}
# PromQL's words that read like metric names.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or"}
_KEYWORDS |= {"unless", "bool", "offset", "inf", "nan"}


def exported_series(url: str) -> set[str]:
    """The names of every series the server at `url` exports, or will once it counts."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in _SUFFIXES.get(family.type, ("",))
    }


def series_named(expr: str) -> set[str]:
    """The metric names a PromQL expression (with Grafana's variables) selects."""
    stripped = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    stripped = re.sub(r"\[[^\]]*\]", "", stripped)  # ranges
    stripped = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", stripped)  # label lists
    stripped = re.sub(r'"[^"]*"', "", stripped)  # strings
    stripped = re.sub(r"\$\w+", "", stripped)  # Grafana's variables
    names = re.findall(r"(?<![\w.])([a-zA-Z_:][\w:]*)\b(?!\s*\()", stripped)
    return {name for name in names if name.lower() not in _KEYWORDS}


def queries(dashboard: dict[str, Any]) -> Iterator[str]:
    """Every PromQL expression of the dashboard: its panels' and its variables'."""
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if variable["type"] == "query":
            text = query["query"] if isinstance(query, dict) else query
            yield re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", text)


def test_the_parser_finds_the_series_of_a_query() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, instance) (rate(a_seconds_bucket{instance=~"$i",'
        ' status="x"}[$__rate_interval]))) / on (instance) b_total offset 5m and bool c'
    )
    assert series_named(expr) == {"a_seconds_bucket", "b_total", "c"}


def test_every_query_names_series_the_server_exports(server: RunningServer) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_series(server.url)
    named: dict[str, set[str]] = {}
    for expr in queries(dashboard):
        found = series_named(expr)
        assert found, f"no series found in {expr!r}"
        for name in found:
            named.setdefault(name, set()).add(expr)
    unknown = {name: exprs for name, exprs in named.items() if name not in exported}
    assert not unknown, f"the dashboard names series the server does not export: {unknown}"
    # The panels cover what an operator watches first.
    for watched in (
        "inference_auction_requests_total",
        "inference_auction_refused_requests_total",
        "inference_auction_queue_length",
        "inference_auction_settle_seconds_bucket",
        "process_resident_memory_bytes",
    ):
        assert watched in named, watched


def test_panels_have_unique_ids_and_a_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
