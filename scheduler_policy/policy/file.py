"""Read the ElasticPolicy file a cluster admin writes (``apiVersion: tide.io/v1alpha1``), and
write one (``policy_yaml``: ``tide tune``'s best policy) that reads back as the same policy.

Parsing collects every problem in a file, each naming its path and value
(``spec.queues[1].headroom.forecastQuantile: must be between 0 and 1, got 1.5``), and raises them
together as one ``PolicyError``, so an admin fixes a file in one pass.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from pathlib import Path
from typing import Any

import yaml

from scheduler_policy.policy.fields import (
    Section,
    boolean,
    duration,
    finite_number,
    format_duration,
    nonempty_string,
    optional_whole_gpus,
    positive_duration,
    read_yaml_documents,
    section,
    show,
    whole_gpus,
)
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

API_VERSION = "tide.io/v1alpha1"
KIND = "ElasticPolicy"

_TOP_KEYS = ("apiVersion", "kind", "metadata", "spec")
_METADATA_KEYS = ("name", "labels", "annotations")
_SPEC_KEYS = ("interval", "modelRefitInterval", "objective", "defaults", "queues", "metrics")
_OBJECTIVES = {o.value: o for o in Objective}
_DEFAULTS_KEYS = ("tolerance", "restartCost", "cooldown", "maxStepUp", "maxStepDown")
_DEFAULTS_KEYS_MORE = ("stabilizationWindow", "assumedRemaining", "starvationBound")
_WINDOW_KEYS = ("up", "down")
_QUEUE_KEYS = ("name", "elastic", "borrowIdleGpus", "maxElasticGpus", "headroom")
_HEADROOM_KEYS = ("gpus", "forecastQuantile", "horizon")
_METRICS_KEYS = ("prometheus",)
_PROMETHEUS_KEYS = ("rateWindow", "lookback", "demandLookback", "queries")
# File key of each query (camelCase of the field): queueAllocated -> queue_allocated.
_QUERY_KEYS = {
    "".join(w if i == 0 else w.capitalize() for i, w in enumerate(f.split("_"))): f
    for f in PrometheusQueries.__dataclass_fields__
}
PLACEHOLDERS = ("rateWindow",)
"""What a query template may name as ``${...}``."""
_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")


def _tolerance(value: object, path: str) -> float:
    number = finite_number(value, path)
    if not 0 <= number < 1:
        raise ValueError(f"{path}: must be at least 0 and less than 1, got {show(value)}")
    return number


def _optional_quantile(value: object, path: str) -> float | None:
    if value is None:
        return None
    number = finite_number(value, path)
    if not 0 < number < 1:
        raise ValueError(f"{path}: must be between 0 and 1, got {show(value)}")
    return number


def _optional_bound(value: object, path: str) -> float | None:
    """``starvationBound``: a duration longer than 0s, or null for no bound."""
    return None if value is None else positive_duration(value, path)


def _step(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{path}: must be an integer, got {show(value)}")
    if value < 1:
        raise ValueError(f"{path}: must be at least 1, got {show(value)}")
    return value


def _objective(value: object, path: str) -> Objective:
    if not isinstance(value, str) or value not in _OBJECTIVES:
        expected = " or ".join(repr(o) for o in _OBJECTIVES)
        raise ValueError(f"{path}: must be {expected}, got {show(value)}")
    return _OBJECTIVES[value]


def _constant(top: Section, key: str, expected: str) -> None:
    if key not in top.mapping:
        top.problems.append(f"{key}: is required; expected {expected!r}")
    elif top.mapping[key] != expected:
        value = top.mapping[key]
        close = isinstance(value, str) and value.lower() == expected.lower()
        hint = f"; did you mean {expected!r}?" if close else ""
        top.problems.append(f"{key}: must be {expected!r}, got {show(value)}{hint}")


def _parse_defaults(spec: Section) -> Defaults:
    base = Defaults()
    defaults = spec.section("defaults", _DEFAULTS_KEYS + _DEFAULTS_KEYS_MORE)
    if defaults is None:
        return base
    window = defaults.section("stabilizationWindow", _WINDOW_KEYS)
    return Defaults(
        tolerance=defaults.get("tolerance", base.tolerance, _tolerance),
        restart_cost_s=defaults.get("restartCost", base.restart_cost_s, duration),
        cooldown_s=defaults.get("cooldown", base.cooldown_s, duration),
        max_step_up=defaults.get("maxStepUp", base.max_step_up, _step),
        max_step_down=defaults.get("maxStepDown", base.max_step_down, _step),
        window_up_s=window.get("up", base.window_up_s, duration) if window else base.window_up_s,
        window_down_s=(
            window.get("down", base.window_down_s, duration) if window else base.window_down_s
        ),
        assumed_remaining_s=defaults.get(
            "assumedRemaining", base.assumed_remaining_s, positive_duration
        ),
        starvation_bound_s=defaults.get(
            "starvationBound", base.starvation_bound_s, _optional_bound
        ),
    )


def _parse_headroom(queue: Section) -> Headroom:
    base = Headroom()
    headroom = queue.section("headroom", _HEADROOM_KEYS)
    if headroom is None:
        return base
    return Headroom(
        gpus=headroom.get("gpus", base.gpus, whole_gpus),
        forecast_quantile=headroom.get(
            "forecastQuantile", base.forecast_quantile, _optional_quantile
        ),
        horizon_s=headroom.get("horizon", base.horizon_s, positive_duration),
    )


def _query(value: object, path: str) -> str:
    """A PromQL template: a non-empty string whose ``${...}`` placeholders are all known."""
    text = nonempty_string(value, path)
    for name in _PLACEHOLDER.findall(text):
        if name not in PLACEHOLDERS:
            close = difflib.get_close_matches(name, PLACEHOLDERS, n=1, cutoff=0.6)
            hint = (
                f"did you mean ${{{close[0]}}}?"
                if close
                else "expected " + " or ".join(f"${{{p}}}" for p in PLACEHOLDERS)
            )
            raise ValueError(f"{path}: unknown placeholder ${{{name}}}; {hint}")
    return text


def _parse_metrics(spec: Section) -> MetricsSettings:
    base = MetricsSettings()
    metrics = spec.section("metrics", _METRICS_KEYS)
    prometheus = metrics.section("prometheus", _PROMETHEUS_KEYS) if metrics else None
    if prometheus is None:
        return base
    queries = prometheus.section("queries", tuple(_QUERY_KEYS))
    base_queries = base.queries
    overrides = {
        field: queries.get(key, getattr(base_queries, field), _query)
        for key, field in _QUERY_KEYS.items()
        if queries is not None and key in queries.mapping
    }
    return MetricsSettings(
        rate_window_s=prometheus.get("rateWindow", base.rate_window_s, positive_duration),
        lookback_s=prometheus.get("lookback", base.lookback_s, positive_duration),
        demand_lookback_s=prometheus.get(
            "demandLookback", base.demand_lookback_s, positive_duration
        ),
        queries=dataclasses.replace(base_queries, **overrides),
    )


def _metrics_document(metrics: MetricsSettings) -> dict[str, Any]:
    """The ``spec.metrics`` section, with only the queries that differ from their defaults."""
    default = PrometheusQueries()
    queries = {
        key: getattr(metrics.queries, field)
        for key, field in _QUERY_KEYS.items()
        if getattr(metrics.queries, field) != getattr(default, field)
    }
    prometheus: dict[str, Any] = {
        "rateWindow": _seconds(metrics.rate_window_s),
        "lookback": _seconds(metrics.lookback_s),
        "demandLookback": _seconds(metrics.demand_lookback_s),
    }
    if queries:
        prometheus["queries"] = queries
    return {"prometheus": prometheus}


def _parse_queue(value: object, *, path: str, problems: list[str]) -> QueuePolicy | None:
    """One queue, or None when it has no valid name (its other problems are still reported)."""
    queue = section(value, path=path, allowed=_QUEUE_KEYS, problems=problems)
    if queue is None:
        return None
    if "name" not in queue.mapping:
        problems.append(f"{path}.name: is required")
    name = queue.get("name", "", nonempty_string)
    base = QueuePolicy(name=QueueName(name))
    parsed = QueuePolicy(
        name=base.name,
        elastic=queue.get("elastic", base.elastic, boolean),
        borrow=queue.get("borrowIdleGpus", base.borrow, boolean),
        headroom=_parse_headroom(queue),
        max_elastic_gpus=queue.get("maxElasticGpus", base.max_elastic_gpus, optional_whole_gpus),
    )
    return parsed if name else None


def _parse_queues(spec: Section) -> tuple[QueuePolicy, ...]:
    if "queues" not in spec.mapping:
        return ()
    value = spec.mapping["queues"]
    if not isinstance(value, list):
        spec.problems.append(f"spec.queues: must be a list of queues, got {show(value)}")
        return ()
    queues: list[QueuePolicy] = []
    first_path: dict[str, str] = {}
    for index, item in enumerate(value):
        path = f"spec.queues[{index}]"
        queue = _parse_queue(item, path=path, problems=spec.problems)
        if queue is None:
            continue
        if queue.name in first_path:
            spec.problems.append(
                f"{path}.name: duplicate queue name {queue.name!r}, "
                f"first defined at {first_path[queue.name]}"
            )
            continue
        first_path[queue.name] = path
        queues.append(queue)
    return tuple(queues)


def parse_policy(data: object, *, source: str) -> ElasticPolicy:
    """Turn a loaded YAML document into an ``ElasticPolicy``.

    Every field but ``apiVersion``, ``kind`` and each queue's ``name`` is optional and takes the
    dataclass default.

    Args:
        data: the document as ``yaml.safe_load`` returns it.
        source: where it came from (a file path), named in the error.

    Returns:
        The policy.

    Raises:
        PolicyError: listing every problem in the document, each naming its path and value.
    """
    problems: list[str] = []
    top = section(data, path="", allowed=_TOP_KEYS, problems=problems)
    if top is None:
        raise PolicyError(source, problems)
    _constant(top, "apiVersion", API_VERSION)
    _constant(top, "kind", KIND)
    base = ElasticPolicy()
    metadata = top.section("metadata", _METADATA_KEYS)
    name = metadata.get("name", base.name, nonempty_string) if metadata else base.name
    spec = top.section("spec", _SPEC_KEYS)
    policy = ElasticPolicy(name=name)
    if spec is not None:
        policy = ElasticPolicy(
            name=name,
            interval_s=spec.get("interval", base.interval_s, positive_duration),
            model_refit_s=spec.get("modelRefitInterval", base.model_refit_s, duration),
            objective=spec.get("objective", base.objective, _objective),
            defaults=_parse_defaults(spec),
            queues=_parse_queues(spec),
            metrics=_parse_metrics(spec),
        )
    if problems:
        raise PolicyError(source, problems)
    return policy


def load_policy(path: str | Path) -> ElasticPolicy:
    """Read and parse an ElasticPolicy file holding exactly one YAML document.

    Args:
        path: the file.

    Returns:
        The policy.

    Raises:
        PolicyError: the file cannot be read, is not valid YAML, holds other than one document,
            or the document is not a valid ElasticPolicy; the error names the file.
    """
    source = str(path)
    documents = [d for d in read_yaml_documents(path) if d is not None]
    if len(documents) != 1:
        raise PolicyError(source, [f"must hold exactly one YAML document, found {len(documents)}"])
    return parse_policy(documents[0], source=source)


def _seconds(value: float) -> str:
    """A duration field as a person writes it (``5m``, not ``300s``) that reads back as the
    policy that ran (``format_duration``)."""
    return format_duration(value)


def _number(value: float) -> float | int:
    """A number field: an integer written as one (``2``, not ``2.0``)."""
    return int(value) if float(value).is_integer() else value


def policy_document(policy: ElasticPolicy) -> dict[str, Any]:
    """``policy`` as the document of an ElasticPolicy file, which ``parse_policy`` reads back as
    ``policy``."""
    d = policy.defaults
    spec: dict[str, Any] = {
        "interval": _seconds(policy.interval_s),
        "modelRefitInterval": _seconds(policy.model_refit_s),
        "objective": policy.objective.value,
        "defaults": {
            "tolerance": _number(d.tolerance),
            "restartCost": _seconds(d.restart_cost_s),
            "cooldown": _seconds(d.cooldown_s),
            "maxStepUp": d.max_step_up,
            "maxStepDown": d.max_step_down,
            "stabilizationWindow": {
                "up": _seconds(d.window_up_s),
                "down": _seconds(d.window_down_s),
            },
            "assumedRemaining": _seconds(d.assumed_remaining_s),
            "starvationBound": (
                None if d.starvation_bound_s is None else _seconds(d.starvation_bound_s)
            ),
        },
        "queues": [
            {
                "name": q.name,
                "elastic": q.elastic,
                "borrowIdleGpus": q.borrow,
                "headroom": {
                    "gpus": _number(q.headroom.gpus),
                    **(
                        {"forecastQuantile": _number(q.headroom.forecast_quantile)}
                        if q.headroom.forecast_quantile is not None
                        else {}
                    ),
                    "horizon": _seconds(q.headroom.horizon_s),
                },
                **(
                    {"maxElasticGpus": _number(q.max_elastic_gpus)}
                    if q.max_elastic_gpus is not None
                    else {}
                ),
            }
            for q in policy.queues
        ],
    }
    if policy.metrics != MetricsSettings():  # files without the section stay as they were
        spec["metrics"] = _metrics_document(policy.metrics)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": policy.name},
        "spec": spec,
    }


def policy_yaml(policy: ElasticPolicy) -> str:
    """``policy`` as an ElasticPolicy file that ``load_policy`` reads back as ``policy``."""
    return yaml.safe_dump(policy_document(policy), sort_keys=False)
