"""manifests/monitoring: the rules pass promtool, and every query of the rules and the dashboard
returns data from a real Prometheus holding the series the cluster would have."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.prometheus_server import PrometheusServer, Series, backfill, require_binaries

MONITORING = Path(__file__).resolve().parents[2] / "manifests" / "monitoring"
RULES = MONITORING / "tide-rules.yaml"
OPERATOR_RULES = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
EXAMPLE_JOB = MONITORING.parent / "examples" / "elastic-pytorch-job.yaml"

# What Grafana puts in place of its variables when every value is selected.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$queue": ".*",
    "$namespace": ".*",
    "$job": ".*",
}


def _plain_groups() -> Any:
    return yaml.safe_load(RULES.read_text())


def _operator_rule() -> Any:
    return yaml.safe_load(OPERATOR_RULES.read_text())


def _rules() -> list[dict[str, str]]:
    return [rule for group in _plain_groups()["groups"] for rule in group["rules"]]


def _dashboard() -> Any:
    return json.loads(DASHBOARD.read_text())


def _panels() -> Iterator[dict[str, Any]]:
    for panel in _dashboard()["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _targets() -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in _panels()
        for target in panel.get("targets", [])
    ]


def _grafana_to_promql(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    left = re.findall(r"\$\w+", expr)
    assert not left, f"{expr!r}: Grafana variables the test does not know: {left}"
    return expr


@pytest.mark.parametrize("which", ["plain", "operator-spec"])
def test_rule_files_pass_promtool(tmp_path: Path, which: str) -> None:
    _, promtool = require_binaries()
    path = RULES
    if which == "operator-spec":
        path = tmp_path / "spec.yaml"
        path.write_text(yaml.safe_dump(_operator_rule()["spec"]))
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in done.stdout


def test_operator_rule_is_the_plain_rules_file() -> None:
    rule = _operator_rule()
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["spec"] == _plain_groups()


def test_podmonitor_scrapes_the_port_the_example_job_serves() -> None:
    monitor = yaml.safe_load((MONITORING / "podmonitor.yaml").read_text())
    assert monitor["kind"] == "PodMonitor"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    job = next(d for d in yaml.safe_load_all(EXAMPLE_JOB.read_text()) if d["kind"] == "Job")
    for task in job["spec"]["tasks"]:
        (container,) = task["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert ports[endpoint["port"]] == int(env["TIDE_METRICS_PORT"]), task["name"]
    selector = monitor["spec"]["selector"]["matchExpressions"]
    assert {"key": "volcano.sh/job-name", "operator": "Exists"} in selector


def test_servicemonitor_names_the_engine_service() -> None:
    monitor = yaml.safe_load((MONITORING / "servicemonitor.yaml").read_text())
    assert monitor["kind"] == "ServiceMonitor"
    assert monitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "tide-engine"}
    service = yaml.safe_load((MONITORING.parent / "deploy" / "service.yaml").read_text())
    assert service["metadata"]["labels"]["app.kubernetes.io/name"] == "tide-engine"
    ports = [p["name"] for p in service["spec"]["ports"]]
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ports == ["http"]


def test_dashboard_panels_have_titles_datasources_and_queries() -> None:
    dashboard = _dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = set()
    for panel in _panels():
        assert panel.get("title"), panel
        assert panel.get("datasource") == {"type": "prometheus", "uid": "${datasource}"}, panel
        ids.add(panel["id"])
        if panel["type"] == "row":
            continue
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(set(refs)) == len(refs), panel["title"]
        assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]
    assert len(ids) == sum(1 for _ in _panels())
    titles = " ".join(p["title"].lower() for p in _panels())
    for wanted in (
        "allocated",
        "deserved",
        "borrowed",
        "replicas",
        "throughput",
        "decisions by reason",
        "forecast against actual",
        "scaling model error",
        "forecast model error",
    ):
        assert wanted in titles


# -- every query against a real Prometheus ------------------------------------------------


@dataclass
class RulesServer(PrometheusServer):
    """A test server that also loads a rules file (the shared fixture loads none)."""

    rules_path: Path | None = None

    def config_text(self) -> str:
        config = json.loads(super().config_text())
        if self.rules_path is not None:
            config["rule_files"] = [str(self.rules_path)]
        return json.dumps(config, indent=2)


def _cluster_series(now: float) -> list[Series]:
    """20 minutes of what a small cluster exports, one sample every 15 s up to 5 s ago."""
    times = [now - 5 - 15 * i for i in range(80)][::-1]

    def gauge(name: str, labels: dict[str, str], value: float) -> Series:
        return Series(name, labels, [(t, value) for t in times])

    def counter(name: str, labels: dict[str, str], per_s: float) -> Series:
        return Series(name, labels, [(t, per_s * (t - times[0])) for t in times], type="counter")

    gpu = {"resource": "nvidia.com/gpu"}
    out = [
        gauge("volcano_queue_allocated_scalar_resources", {"queue_name": "research", **gpu}, 12e3),
        gauge("volcano_queue_allocated_scalar_resources", {"queue_name": "production", **gpu}, 8e3),
        gauge("volcano_queue_deserved_scalar_resources", {"queue_name": "research", **gpu}, 8e3),
        gauge("volcano_queue_deserved_scalar_resources", {"queue_name": "production", **gpu}, 24e3),
        gauge("volcano_queue_request_scalar_resources", {"queue_name": "research", **gpu}, 12e3),
        gauge("volcano_queue_request_scalar_resources", {"queue_name": "production", **gpu}, 8e3),
        gauge(
            "kube_node_status_allocatable",
            {"node": "n0", "resource": "nvidia_com_gpu", "unit": "integer"},
            32,
        ),
    ]
    pods = [
        ("ml", "bert-worker-0", "bert", "research", "true"),
        ("ml", "bert-worker-1", "bert", "research", "true"),
        ("prod", "serve-worker-0", "serve", "production", ""),
    ]
    for ns, pod, job, queue, elastic in pods:
        labels = {
            "namespace": ns,
            "pod": pod,
            "label_volcano_sh_job_name": job,
            "label_volcano_sh_queue_name": queue,
        }
        if elastic:
            labels["label_tide_io_elastic"] = elastic
        out.append(gauge("kube_pod_labels", labels, 1))
        out.append(
            gauge("kube_pod_status_phase", {"namespace": ns, "pod": pod, "phase": "Running"}, 1)
        )
        out.append(
            gauge(
                "kube_pod_container_resource_requests",
                {
                    "namespace": ns,
                    "pod": pod,
                    "container": "trainer",
                    "node": "n0",
                    "resource": "nvidia_com_gpu",
                    "unit": "integer",
                },
                4,
            )
        )
        if elastic:
            worker = {"namespace": ns, "volcano_job": job, "pod": pod}
            out.append(counter("tide_worker_samples_total", worker, 100.0))
            out.append(gauge("tide_worker_world_size", worker, 2))
            for le, share in (("0.1", 0.2), ("0.25", 0.7), ("+Inf", 1.0)):
                s = counter("tide_worker_step_seconds_bucket", {**worker, "le": le}, share * 4)
                out.append(Series(s.name, s.labels, s.samples, type="unknown"))
    # The engine's own metrics (metrics_collector/engine_metrics.py).
    job = {"namespace": "ml", "volcano_job": "bert"}
    research, production = {"queue_name": "research"}, {"queue_name": "production"}
    out += [
        gauge("tide_job_replicas", job, 2),
        gauge("tide_job_target_replicas", job, 3),
        gauge("tide_scaling_model_relative_error_ratio", job, 0.08),
        counter("tide_decisions_total", {"reason": "ScaleUpForIdleGpus"}, 0.1),
        counter("tide_decisions_total", {"reason": "WithinTolerance"}, 0.5),
        counter("tide_replica_writes_total", {"outcome": "applied"}, 0.1),
        gauge("tide_queue_budget_gpus", research, 14),
        gauge("tide_queue_headroom_gpus", production, 2),
        gauge("tide_queue_forecast_gpus", production, 9),
        gauge("tide_forecast_coverage_ratio", production, 0.9),
        gauge("tide_metrics_stale_series", {}, 0),
    ]
    for le, share in (("0.05", 0.5), ("0.25", 0.9), ("+Inf", 1.0)):
        s = counter("tide_reconcile_duration_seconds_bucket", {"le": le}, share / 30)
        out.append(Series(s.name, s.labels, s.samples, type="unknown"))
    return out


@pytest.fixture(scope="module")
def rules_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RulesServer]:
    _, promtool = require_binaries()
    root = tmp_path_factory.mktemp("monitoring")
    fast = _plain_groups()
    for group in fast["groups"]:  # evaluate every second, not every 30 s: same expressions
        group["interval"] = "1s"
    rules_path = root / "rules.yaml"
    rules_path.write_text(yaml.safe_dump(fast))
    server = RulesServer(root / "prometheus", rules_path=rules_path)
    backfill(server.tsdb_dir, _cluster_series(time.time()), promtool=promtool)
    server.start()
    try:
        for rule in _rules():
            server.wait_for_series(rule["record"], timeout_s=30)
        yield server
    finally:
        server.stop()


@pytest.mark.prometheus
@pytest.mark.parametrize("rule", _rules(), ids=[r["record"] for r in _rules()])
def test_recording_rule_returns_data(rules_server: RulesServer, rule: dict[str, str]) -> None:
    direct = rules_server.query(rule["expr"])
    recorded = rules_server.query(rule["record"])
    assert direct, rule["expr"]
    assert {json.dumps(r["metric"], sort_keys=True) for r in direct} == {
        json.dumps({k: v for k, v in r["metric"].items() if k != "__name__"}, sort_keys=True)
        for r in recorded
    }


@pytest.mark.prometheus
@pytest.mark.parametrize(
    ("title", "expr"), _targets(), ids=[f"{t}:{e[:40]}" for t, e in _targets()]
)
def test_dashboard_query_returns_data(rules_server: RulesServer, title: str, expr: str) -> None:
    result = rules_server.query(_grafana_to_promql(expr))
    assert result, f"{title}: {expr}"
    assert all(float(r["value"][1]) == float(r["value"][1]) for r in result)  # no NaN


@pytest.mark.prometheus
def test_dashboard_variables_have_values(rules_server: RulesServer) -> None:
    for variable in _dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"]["query"])
        assert match, variable["name"]
        selector, label = match.groups()
        result = rules_server.query(_grafana_to_promql(selector))
        assert any(label in r["metric"] for r in result), variable["name"]


@pytest.mark.prometheus
@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ("queue_name:tide_queue_allocated_gpus:sum", {"research": 12.0, "production": 8.0}),
        ("queue_name:tide_queue_borrowed_gpus:sum", {"research": 4.0, "production": 0.0}),
        ("queue_name:tide_queue_nonelastic_demand_gpus:sum", {"production": 4.0}),
        ("tide_cluster_requested_gpus:sum", {"": 12.0}),
        ("namespace_volcano_job:tide_worker_samples:rate2m", {"bert": 200.0}),
        ("namespace_volcano_job:tide_worker_pods:count", {"bert": 2.0}),
    ],
    ids=[
        "allocated-milli-units-to-gpus",
        "borrowed-beyond-deserved",
        "elastic-pods-left-out-of-demand",
        "cluster-requested",
        "throughput-sums-pods",
        "pods-of-a-job",
    ],
)
def test_recorded_values(
    rules_server: RulesServer, record: str, expected: dict[str, float]
) -> None:
    """Hand-computed from ``_cluster_series``: research holds 12 GPUs against a deserved 8;
    the only non-elastic pod asks for 4; two bert pods make 100 samples/s each."""
    got = {
        r["metric"].get("queue_name", r["metric"].get("volcano_job", "")): float(r["value"][1])
        for r in rules_server.query(record)
    }
    assert got == pytest.approx(expected)
