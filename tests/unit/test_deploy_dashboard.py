"""The Grafana dashboard charts metrics the actors really export, from the provisioned datasource."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client.core import CounterMetricFamily

from actors.llm import metrics as llm_metrics
from actors.runtime.latency import METRIC_NAMES
from actors.runtime.metrics import ActorCollector

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "kfoundry.json"


def _exported() -> set[str]:
    """Every sample name the actors' /metrics page can carry."""
    names = {f"{h}{suffix}" for h in METRIC_NAMES for suffix in ("_bucket", "_sum", "_count")}
    for family in ActorCollector([]).collect():
        names.add(f"{family.name}_total" if isinstance(family, CounterMetricFamily) else family.name)
    for name in llm_metrics.METRIC_NAMES:  # the LLM clients' own series
        names |= {f"{name}{suffix}" for suffix in ("_total", "_bucket", "_sum", "_count")}
    return names


def _exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_dashboard_charts_only_exported_metrics_and_every_latency_histogram() -> None:
    used = {m for e in _exprs() for m in re.findall(r"\bkfoundry_[a-z_]+", e)}
    assert used, "the dashboard charts nothing"
    assert {"kfoundry_llm_tokens_total", "kfoundry_llm_cost_total", "kfoundry_llm_call_seconds_bucket"} <= used
    assert used <= _exported(), sorted(used - _exported())
    for histogram in METRIC_NAMES:
        assert f"{histogram}_bucket" in used, f"no latency panel for {histogram}"


def test_dashboard_actor_values_are_statistics_some_actor_reports() -> None:
    # kfoundry_actor_value{name="..."} carries an actor's extra_stats keys.
    names = {n for e in _exprs() for n in re.findall(r'kfoundry_actor_value\{[^}]*name="(\w+)"', e)}
    sources = "".join(p.read_text() for d in ("kinds", "runtime") for p in (ROOT / "actors" / d).glob("*.py"))
    reported = set(re.findall(r'"(\w+)":', sources))
    assert names
    assert names <= reported, sorted(names - reported)


def test_dashboard_panels_use_the_provisioned_datasource() -> None:
    datasource = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    uid = datasource["datasources"][0]["uid"]
    dash = json.loads(DASHBOARD.read_text())
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    assert all(p["datasource"]["uid"] == uid for p in panels)
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "kfoundry.yaml").read_text())
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./grafana/dashboards:{provider['providers'][0]['options']['path']}:ro" in mounts
