"""Tests for the ElasticPolicy file parser: durations, every error message, loading files."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from scheduler_policy.policy.fields import parse_duration
from scheduler_policy.policy.file import load_policy, parse_policy, policy_yaml
from scheduler_policy.policy.spec import (
    Defaults,
    ElasticPolicy,
    Headroom,
    MetricsSettings,
    Objective,
    PrometheusQueries,
    QueuePolicy,
)
from scheduler_policy.vocabulary.errors import PolicyError
from scheduler_policy.vocabulary.state import QueueName

POLICIES_DIR = Path(__file__).resolve().parents[2] / "manifests" / "policies"


def make_doc(spec: Any = None, **top: Any) -> dict[str, Any]:
    """A policy document with valid apiVersion and kind; ``top`` replaces or adds top-level keys."""
    doc: dict[str, Any] = {"apiVersion": "tide.io/v1alpha1", "kind": "ElasticPolicy"}
    if spec is not None:
        doc["spec"] = spec
    doc.update(top)
    return doc


def queues(*items: Any) -> dict[str, Any]:
    return {"queues": list(items)}


def prom(**prometheus: Any) -> dict[str, Any]:
    return {"metrics": {"prometheus": prometheus}}


# ---------------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("0s", 0.0),
        ("2m30s", 150.0),
        ("1s500ms", 1.5),
        ("1.5h", 5400.0),
        (" 10m ", 600.0),
    ],
    ids=["seconds", "minutes", "hours", "hours-minutes", "millis", "zero", "min-sec", "sec-ms",
         "fractional", "surrounding-space"],
)  # fmt: skip
def test_parse_duration_accepts(text: str, seconds: float) -> None:
    assert parse_duration(text, path="spec.interval") == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (30, "spec.interval: must be a duration string such as '30s', got 30"),
        (1.5, "spec.interval: must be a duration string such as '1.5s', got 1.5"),
        (True, "spec.interval: must be a duration string such as '30s', got true"),
        (None, "spec.interval: must be a duration string such as '30s', got null"),
        ("-5m", "spec.interval: must not be negative, got '-5m'"),
        ("5 min", "spec.interval: must be a duration such as '30s', '5m', '1h30m' or '500ms', "
                  "got '5 min'"),
        ("", "spec.interval: must be a duration such as '30s', '5m', '1h30m' or '500ms', got ''"),
        ("30", "spec.interval: must be a duration such as '30s', '5m', '1h30m' or '500ms', "
               "got '30'"),
        ("30m1h", "spec.interval: must be a duration such as '30s', '5m', '1h30m' or '500ms', "
                  "got '30m1h'"),
        ("1d", "spec.interval: must be a duration such as '30s', '5m', '1h30m' or '500ms', "
               "got '1d'"),
    ],
    ids=["bare-int", "bare-float", "bool", "null", "negative", "spaced-unit", "empty",
         "digits-only", "units-out-of-order", "days-unsupported"],
)  # fmt: skip
def test_parse_duration_refuses(value: object, message: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        parse_duration(value, path="spec.interval")
    assert str(excinfo.value) == message


@given(
    hours=st.integers(min_value=0, max_value=1000),
    minutes=st.integers(min_value=0, max_value=59),
    seconds=st.integers(min_value=0, max_value=59),
    millis=st.integers(min_value=0, max_value=999),
)
def test_parse_duration_round_trips(hours: int, minutes: int, seconds: int, millis: int) -> None:
    parts = [(hours, "h"), (minutes, "m"), (seconds, "s"), (millis, "ms")]
    text = "".join(f"{amount}{unit}" for amount, unit in parts if amount) or "0s"
    expected = hours * 3600 + minutes * 60 + seconds + millis / 1000
    assert math.isclose(parse_duration(text, path="x"), expected, rel_tol=1e-12, abs_tol=1e-12)


# -------------------------------------------------------------------------- valid documents


def test_minimal_document_takes_every_default() -> None:
    assert parse_policy(make_doc(), source="p.yaml") == ElasticPolicy()


def test_full_document_sets_every_field() -> None:
    doc = make_doc(
        metadata={"name": "research-cluster"},
        spec={
            "interval": "30s",
            "modelRefitInterval": "15m",
            "defaults": {
                "tolerance": 0.1,
                "restartCost": "45s",
                "cooldown": "2m",
                "maxStepUp": 8,
                "maxStepDown": 3,
                "stabilizationWindow": {"up": "1m", "down": "10m"},
                "assumedRemaining": "2h",
                "starvationBound": "90m",
            },
            "queues": [
                {
                    "name": "research",
                    "elastic": True,
                    "borrowIdleGpus": True,
                    "maxElasticGpus": 32,
                    "headroom": {"gpus": 2, "forecastQuantile": 0.9, "horizon": "45m"},
                },
                {"name": "production", "elastic": False},
            ],
        },
    )
    assert parse_policy(doc, source="p.yaml") == ElasticPolicy(
        name="research-cluster",
        interval_s=30.0,
        model_refit_s=900.0,
        defaults=Defaults(
            tolerance=0.1,
            restart_cost_s=45.0,
            cooldown_s=120.0,
            max_step_up=8,
            max_step_down=3,
            window_up_s=60.0,
            window_down_s=600.0,
            assumed_remaining_s=7200.0,
            starvation_bound_s=5400.0,
        ),
        queues=(
            QueuePolicy(
                name=QueueName("research"),
                elastic=True,
                borrow=True,
                headroom=Headroom(gpus=2.0, forecast_quantile=0.9, horizon_s=2700.0),
                max_elastic_gpus=32.0,
            ),
            QueuePolicy(name=QueueName("production"), elastic=False),
        ),
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [("completionTime", Objective.COMPLETION_TIME), ("speedup", Objective.SPEEDUP)],
    ids=["completion-time", "speedup"],
)
def test_objective(value: str, expected: Objective) -> None:
    assert parse_policy(make_doc({"objective": value}), source="p.yaml").objective is expected


def test_explicit_nulls_mean_unset_for_optional_fields() -> None:
    doc = make_doc(
        queues({"name": "q", "maxElasticGpus": None, "headroom": {"forecastQuantile": None}})
    )
    (queue,) = parse_policy(doc, source="p.yaml").queues
    assert queue.max_elastic_gpus is None
    assert queue.headroom.forecast_quantile is None
    unbound = parse_policy(make_doc({"defaults": {"starvationBound": None}}), source="p.yaml")
    assert unbound.defaults.starvation_bound_s is None
    assert parse_policy(yaml.safe_load(policy_yaml(unbound)), source="again") == unbound


# ------------------------------------------------------------------------------ every error

ERROR_CASES = [
    ([], "document: must be a mapping, got []"),
    ({"kind": "ElasticPolicy"}, "apiVersion: is required; expected 'tide.io/v1alpha1'"),
    (make_doc(apiVersion="tide.io/v1"), "apiVersion: must be 'tide.io/v1alpha1', got 'tide.io/v1'"),
    ({"apiVersion": "tide.io/v1alpha1"}, "kind: is required; expected 'ElasticPolicy'"),
    (make_doc(kind="Policy"), "kind: must be 'ElasticPolicy', got 'Policy'"),
    (make_doc(specs={}), "specs: unknown key; did you mean 'spec'?"),
    (make_doc(metadata="x"), "metadata: must be a mapping, got 'x'"),
    (make_doc(metadata={"name": ""}), "metadata.name: must be a non-empty string, got ''"),
    (make_doc(metadata={"nam": "x"}), "metadata.nam: unknown key; did you mean 'name'?"),
    (make_doc(spec=["x"]), "spec: must be a mapping, got ['x']"),
    (make_doc({"zzz": 1}), "spec.zzz: unknown key; expected one of 'interval', "
                           "'modelRefitInterval', 'objective', 'defaults', 'queues', "
                           "'metrics'"),
    (make_doc({"interval": 60}), "spec.interval: must be a duration string such as '60s', got 60"),
    (make_doc({"interval": "0s"}), "spec.interval: must be longer than 0s, got '0s'"),
    (
        make_doc({"objective": "fastest"}),
        "spec.objective: must be 'completionTime' or 'speedup', got 'fastest'",
    ),
    (make_doc({"modelRefitInterval": "-1m"}), "spec.modelRefitInterval: must not be negative, "
                                              "got '-1m'"),
    (make_doc({"defaults": 5}), "spec.defaults: must be a mapping, got 5"),
    (make_doc({"defaults": {"toleranse": 0.1}}), "spec.defaults.toleranse: unknown key; "
                                                 "did you mean 'tolerance'?"),
    (make_doc({"defaults": {"tolerance": 1.0}}), "spec.defaults.tolerance: must be at least 0 "
                                                 "and less than 1, got 1.0"),
    (make_doc({"defaults": {"tolerance": -0.1}}), "spec.defaults.tolerance: must be at least 0 "
                                                  "and less than 1, got -0.1"),
    (make_doc({"defaults": {"tolerance": True}}), "spec.defaults.tolerance: must be a number, "
                                                  "got true"),
    (make_doc({"defaults": {"tolerance": "5%"}}), "spec.defaults.tolerance: must be a number, "
                                                  "got '5%'"),
    (make_doc({"defaults": {"tolerance": float("nan")}}), "spec.defaults.tolerance: must be a "
                                                          "finite number, got nan"),
    (make_doc({"defaults": {"restartCost": 30}}), "spec.defaults.restartCost: must be a duration "
                                                  "string such as '30s', got 30"),
    (make_doc({"defaults": {"cooldown": "5 minutes"}}), "spec.defaults.cooldown: must be a "
        "duration such as '30s', '5m', '1h30m' or '500ms', got '5 minutes'"),
    (make_doc({"defaults": {"maxStepUp": "four"}}), "spec.defaults.maxStepUp: must be an "
                                                    "integer, got 'four'"),
    (make_doc({"defaults": {"maxStepUp": 0}}), "spec.defaults.maxStepUp: must be at least 1, "
                                               "got 0"),
    (make_doc({"defaults": {"maxStepDown": 2.0}}), "spec.defaults.maxStepDown: must be an "
                                                   "integer, got 2.0"),
    (make_doc({"defaults": {"maxStepDown": True}}), "spec.defaults.maxStepDown: must be an "
                                                    "integer, got true"),
    (make_doc({"defaults": {"stabilizationWindow": "5m"}}), "spec.defaults.stabilizationWindow: "
                                                            "must be a mapping, got '5m'"),
    (make_doc({"defaults": {"stabilizationWindow": {"down": 300}}}),
     "spec.defaults.stabilizationWindow.down: must be a duration string such as '300s', got 300"),
    (make_doc({"defaults": {"stabilizationWindow": {"dwn": "1m"}}}),
     "spec.defaults.stabilizationWindow.dwn: unknown key; did you mean 'down'?"),
    (make_doc({"defaults": {"assumedRemaining": "0s"}}), "spec.defaults.assumedRemaining: must "
                                                         "be longer than 0s, got '0s'"),
    (make_doc({"defaults": {"starvationBound": "0s"}}), "spec.defaults.starvationBound: must "
                                                        "be longer than 0s, got '0s'"),
    (make_doc({"defaults": {"starvationBound": 7200}}),
     "spec.defaults.starvationBound: must be a duration string such as '7200s', got 7200"),
    (make_doc({"queues": {"name": "q"}}), "spec.queues: must be a list of queues, "
                                          "got {'name': 'q'}"),
    (make_doc(queues("research")), "spec.queues[0]: must be a mapping, got 'research'"),
    (make_doc(queues({"elastic": True})), "spec.queues[0].name: is required"),
    (make_doc(queues({"name": 7})), "spec.queues[0].name: must be a non-empty string, got 7"),
    (make_doc(queues({"name": "a"}, {"name": "b"}, {"name": "a"})),
     "spec.queues[2].name: duplicate queue name 'a', first defined at spec.queues[0]"),
    (make_doc(queues({"name": "q", "elastic": "yes"})), "spec.queues[0].elastic: must be true "
                                                        "or false, got 'yes'"),
    (make_doc(queues({"name": "q", "borrowIdleGpus": 1})), "spec.queues[0].borrowIdleGpus: must "
                                                           "be true or false, got 1"),
    (make_doc(queues({"name": "q", "borrow": True})), "spec.queues[0].borrow: unknown key; "
                                                      "did you mean 'borrowIdleGpus'?"),
    (make_doc(queues({"name": "q", "maxElasticGpus": -1})), "spec.queues[0].maxElasticGpus: "
                                                            "must not be negative, got -1"),
    (make_doc(queues({"name": "q", "maxElasticGpus": "lots"})), "spec.queues[0].maxElasticGpus: "
                                                                "must be a number, got 'lots'"),
    (make_doc(queues({"name": "q", "headroom": 2})), "spec.queues[0].headroom: must be a "
                                                     "mapping, got 2"),
    (make_doc(queues({"name": "q", "headroom": {"gpus": -2}})), "spec.queues[0].headroom.gpus: "
                                                                "must not be negative, got -2"),
    (make_doc(queues({"name": "a"}, {"name": "b", "headroom": {"forecastQuantile": 1.5}})),
     "spec.queues[1].headroom.forecastQuantile: must be between 0 and 1, got 1.5"),
    (make_doc(queues({"name": "q", "headroom": {"forecastQuantile": 0}})),
     "spec.queues[0].headroom.forecastQuantile: must be between 0 and 1, got 0"),
    (make_doc(queues({"name": "q", "headroom": {"horizon": "0s"}})),
     "spec.queues[0].headroom.horizon: must be longer than 0s, got '0s'"),
    (make_doc(queues({"name": "q", "headroom": {"quantile": 0.9}})),
     "spec.queues[0].headroom.quantile: unknown key; did you mean 'forecastQuantile'?"),
    (make_doc({"metrics": {"promethus": {}}}),
     "spec.metrics.promethus: unknown key; did you mean 'prometheus'?"),
    (make_doc(prom(rateWindow=120)),
     "spec.metrics.prometheus.rateWindow: must be a duration string such as '120s', got 120"),
    (make_doc(prom(lookback="0s")),
     "spec.metrics.prometheus.lookback: must be longer than 0s, got '0s'"),
    (make_doc(prom(queries={"jobThrouput": "x"})),
     "spec.metrics.prometheus.queries.jobThrouput: unknown key; did you mean 'jobThroughput'?"),
    (make_doc(prom(queries={"jobThroughput": "rate(x[${rateWindw}])"})),
     "spec.metrics.prometheus.queries.jobThroughput: unknown placeholder ${rateWindw}; "
     "did you mean ${rateWindow}?"),
    (make_doc(prom(queries={"queueAllocated": "x{a=\"${queue}\"}"})),
     "spec.metrics.prometheus.queries.queueAllocated: unknown placeholder ${queue}; "
     "expected ${rateWindow}"),
    (make_doc(prom(queries={"jobWorldSize": ""})),
     "spec.metrics.prometheus.queries.jobWorldSize: must be a non-empty string, got ''"),
]  # fmt: skip
ERROR_IDS = [
    "not-a-mapping", "apiversion-missing", "apiversion-wrong", "kind-missing", "kind-wrong",
    "unknown-top-key", "metadata-not-mapping", "metadata-name-empty", "metadata-unknown-key",
    "spec-not-mapping", "spec-unknown-key-no-suggestion", "interval-bare-number", "interval-zero",
    "objective-unknown",
    "refit-negative", "defaults-not-mapping", "defaults-typo", "tolerance-one",
    "tolerance-negative", "tolerance-bool", "tolerance-string", "tolerance-nan",
    "restart-cost-bare-number", "cooldown-spelled-out", "step-up-word", "step-up-zero",
    "step-down-float", "step-down-bool", "window-not-mapping", "window-down-bare-number",
    "window-typo", "assumed-remaining-zero", "starvation-bound-zero",
    "starvation-bound-not-a-duration", "queues-not-list", "queue-not-mapping",
    "queue-name-missing", "queue-name-not-string", "queue-name-duplicate", "elastic-yes-string",
    "borrow-int", "borrow-short-key", "max-elastic-negative", "max-elastic-string",
    "headroom-not-mapping", "headroom-gpus-negative", "quantile-above-one", "quantile-zero",
    "horizon-zero", "headroom-typo", "metrics-typo", "rate-window-bare-number",
    "lookback-zero", "query-typo", "placeholder-typo", "placeholder-unknown", "query-empty",
]  # fmt: skip


@pytest.mark.parametrize(("doc", "message"), ERROR_CASES, ids=ERROR_IDS)
def test_each_error_names_path_and_value(doc: object, message: str) -> None:
    with pytest.raises(PolicyError) as excinfo:
        parse_policy(doc, source="cluster.yaml")
    assert excinfo.value.source == "cluster.yaml"
    assert excinfo.value.problems == [message]


def test_all_errors_in_a_document_are_raised_together() -> None:
    doc = {
        "apiVersion": "tide.io/v1",
        "spec": {
            "interval": 60,
            "defaults": {"toleranse": 0.1, "maxStepUp": "four"},
            "queues": [
                {"name": "research", "headroom": {"forecastQuantile": 1.5}},
                {"name": "research"},
            ],
        },
    }
    with pytest.raises(PolicyError) as excinfo:
        parse_policy(doc, source="cluster.yaml")
    assert excinfo.value.problems == [
        "apiVersion: must be 'tide.io/v1alpha1', got 'tide.io/v1'",
        "kind: is required; expected 'ElasticPolicy'",
        "spec.interval: must be a duration string such as '60s', got 60",
        "spec.defaults.toleranse: unknown key; did you mean 'tolerance'?",
        "spec.defaults.maxStepUp: must be an integer, got 'four'",
        "spec.queues[0].headroom.forecastQuantile: must be between 0 and 1, got 1.5",
        "spec.queues[1].name: duplicate queue name 'research', first defined at spec.queues[0]",
    ]
    assert str(excinfo.value).startswith("cluster.yaml: 7 problem(s):\n  - apiVersion:")


# ---------------------------------------------------------------------------------- files


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("apiVersion: tide.io/v1alpha1\nkind: ElasticPolicy\nspec:\n  interval: [60s\n",
         "line 5, column 1: invalid YAML: expected ',' or ']', but got '<stream end>'"),
        ("apiVersion: tide.io/v1alpha1\n  kind: ElasticPolicy\n",
         "line 2, column 7: invalid YAML: mapping values are not allowed here"),
        ("", "must hold exactly one YAML document, found 0"),
        ("apiVersion: tide.io/v1alpha1\nkind: ElasticPolicy\n---\napiVersion: tide.io/v1alpha1\n",
         "must hold exactly one YAML document, found 2"),
        ("apiVersion: tide.io/v1alpha1\nkind: ElasticPolicy\nspec:\n  interval: 60\n",
         "spec.interval: must be a duration string such as '60s', got 60"),
    ],
    ids=["unclosed-flow-list", "bad-indentation", "empty-file", "two-documents", "invalid-field"],
)  # fmt: skip
def test_load_policy_refuses(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PolicyError) as excinfo:
        load_policy(path)
    assert excinfo.value.source == str(path)
    assert excinfo.value.problems == [problem]


def test_load_policy_names_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(PolicyError) as excinfo:
        load_policy(path)
    assert excinfo.value.source == str(path)
    assert excinfo.value.problems[0].startswith("cannot read file: [Errno 2]")


def test_load_policy_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "apiVersion: tide.io/v1alpha1\nkind: ElasticPolicy\nmetadata: {name: small}\n"
        "spec:\n  interval: 2m\n  queues:\n    - name: research\n      borrowIdleGpus: true\n",
        encoding="utf-8",
    )
    assert load_policy(str(path)) == ElasticPolicy(
        name="small",
        interval_s=120.0,
        queues=(QueuePolicy(name=QueueName("research"), borrow=True),),
    )


EXAMPLE_POLICIES = sorted(POLICIES_DIR.glob("*.yaml"))


def test_example_policies_exist() -> None:
    names = {path.name for path in EXAMPLE_POLICIES}
    assert {"default.yaml", "research-and-production.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLE_POLICIES, ids=[p.name for p in EXAMPLE_POLICIES])
def test_example_policy_parses(path: Path) -> None:
    policy = load_policy(path)
    assert policy.name == path.stem
    assert policy.queues, "an example policy should manage at least one queue"


def test_default_example_spells_out_the_defaults() -> None:
    policy = load_policy(POLICIES_DIR / "default.yaml")
    # Every field at its dataclass default; the built-in cluster's two queues (the simulator's
    # default policy, ``default_policy_for``: tests/cli/test_files.py).
    assert policy == ElasticPolicy(
        queues=(
            QueuePolicy(name=QueueName("research"), borrow=True),
            QueuePolicy(name=QueueName("production"), elastic=False),
        )
    )


@pytest.mark.parametrize(
    ("prometheus", "expected"),
    [
        ({}, MetricsSettings()),
        (
            {"rateWindow": "1m", "lookback": "3h", "demandLookback": "336h"},
            MetricsSettings(
                rate_window_s=60.0, lookback_s=3 * 3600.0, demand_lookback_s=336 * 3600.0
            ),
        ),
        (
            {
                "queries": {
                    "jobThroughput": "sum by (namespace, volcano_job) (rate(my_samples[2m]))"
                }
            },
            MetricsSettings(
                queries=PrometheusQueries(
                    job_throughput="sum by (namespace, volcano_job) (rate(my_samples[2m]))"
                )
            ),
        ),
        (
            # label_replace's $1 is PromQL's own, not a placeholder.
            {
                "queries": {
                    "queueNonelasticDemand": 'label_replace(x, "queue_name", "$1", "q", "(.+)")'
                }
            },
            MetricsSettings(
                queries=PrometheusQueries(
                    queue_nonelastic_demand='label_replace(x, "queue_name", "$1", "q", "(.+)")'
                )
            ),
        ),
    ],
    ids=["empty-section-is-default", "durations", "query-override", "dollar-one-passes"],
)
def test_metrics_section(prometheus: dict[str, Any], expected: MetricsSettings) -> None:
    policy = parse_policy(make_doc(prom(**prometheus)), source="p.yaml")
    assert policy.metrics == expected
    # And it reads back as written.
    assert parse_policy(yaml.safe_load(policy_yaml(policy)), source="p.yaml") == policy


def test_a_policy_without_metrics_writes_no_metrics_section() -> None:
    assert (
        "metrics" not in yaml.safe_load(policy_yaml(parse_policy(make_doc({}), source="p")))["spec"]
    )
