"""cluster/monitoring/: every query of the alerting rules and the Grafana dashboard parses as PromQL
(tests/promql_check.py, which says what it covers) and names only metrics the service exports (the
names in a rendered ``GET /metrics`` of a service that scored parts of a product with drift windows)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO
from promql_check import PromQLError, metric_names

from hetmm_ray.config import ServiceConfig
from hetmm_ray.core.scoring import Calibration
from hetmm_ray.serve.inspections import DRIFT_METRICS, DriftCollector, Inspections
from hetmm_ray.serve.metrics import ServiceMetrics
from hetmm_ray.store import open_store

MONITORING = REPO / "cluster" / "monitoring"


def alert_queries() -> list[str]:
    rules = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def dashboard_queries() -> list[str]:
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The metric names a service exports once it has scored parts (every family has a sample)."""
    store = open_store(tmp_path_factory.mktemp("store"))
    inspections = Inspections(ServiceConfig(drift_parts_short=10, drift_parts_long=20, drift_min_parts=1), store)
    inspections.monitor.reference = lambda product, version: Calibration(tuple(0.1 * i for i in range(10)))
    metrics = ServiceMetrics()
    metrics.register(DriftCollector(inspections))
    results: list[dict[str, Any]] = [
        {
            "score": 0.1 * (i % 9),
            "threshold": 0.85,
            "is_anomaly": i % 9 == 8,
            "verdict": "reject" if i % 9 == 8 else "ok",
            "version": 1,
            "estimated_false_alarm_rate": 0.01,
            "timing": {"batch_images": 1},
        }
        for i in range(30)
    ]
    metrics.observe_request("predict", 200, 0.01)
    metrics.observe_results("gear", results)
    inspections.monitor.observe("gear", [{**r, "time": time.time(), "expected_rate": 0.01} for r in results])
    inspections.monitor.evaluate()
    inspections.recorder.by_product["gear"] = {"written": 3, "dropped": 1}
    text = metrics.render().decode()
    inspections.recorder.close()
    names = {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{| )", text, re.MULTILINE)}
    assert {n for n in DRIFT_METRICS if n != "hetmm_record_rows"} <= names  # every family has samples
    return names


@pytest.mark.parametrize("source", ["alerts", "dashboard"])
def test_every_query_parses_and_names_exported_metrics(source: str, exported: set[str]) -> None:
    queries = alert_queries() if source == "alerts" else dashboard_queries()
    assert len(queries) >= 5
    seen: set[str] = set()
    for q in queries:
        names = metric_names(q)
        assert names, f"{q!r} selects no metric"
        missing = [n for n in names if n not in exported]
        assert not missing, f"{q!r} names metrics the service does not export: {missing}"
        seen.update(names)
    assert any(n.startswith("hetmm_drift_") for n in seen)


def test_dashboard_variable_names_an_exported_metric(exported: set[str]) -> None:
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            found = re.fullmatch(r"label_values\((\w+), *(\w+)\)", var["definition"])
            assert found and found.group(1) in exported


@pytest.mark.parametrize(
    "expr",
    [
        "sum(rate(x[5m])",  # unbalanced
        "x{a=b}",  # unquoted value
        'x{a=~"b",,}',  # empty matcher
        "rate(x[5])",  # a duration needs a unit
        "foo bar",  # two expressions
        "unknown_fn(x)",
        "sum by product (x)",  # labels need parentheses
        "x > on product y",
        "{}",
        "x offset",
        "x +",
    ],
)
def test_the_check_refuses_what_is_not_promql(expr: str) -> None:
    with pytest.raises(PromQLError):
        metric_names(expr)


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", ["up"]),
        ('sum by (a) (rate(x_total{a="1", b!~"2.*",}[5m] offset -1h)) / ignoring (b) group_left y', ["x_total", "y"]),
        ("topk(3, x) or -y ^ 2 ^ 3 unless on () z @ start()", ["x", "y", "z"]),
        ('{__name__="x"}', ["x"]),
        ("max_over_time(x[1h:5m]) > bool 0.5e-3", ["x"]),
        ("histogram_quantile(0.9, sum without (le) (rate(h_bucket[1m])))", ["h_bucket"]),
        ('count_values("v", x) and 0x1F < Inf', ["x"]),
    ],
)
def test_the_check_accepts_promql_and_finds_the_metrics(expr: str, names: list[str]) -> None:
    assert metric_names(expr) == names


def test_monitoring_folder_holds_the_two_files() -> None:
    assert sorted(p.name for p in Path(MONITORING).iterdir()) == ["alerts.yaml", "grafana-dashboard.json"]
