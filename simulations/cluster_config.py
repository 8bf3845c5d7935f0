"""The simulated cluster's shape: nodes, GPUs per node and Volcano Queues, from YAML or built in."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scheduler_policy.policy.fields import yaml_problem
from scheduler_policy.vocabulary.state import QueueName
from simulations.errors import ClusterFileError


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A Volcano Queue.

    Attributes:
        name: the queue's name.
        weight: its weight in the proportion plugin's share of the cluster.
        capability_gpus: ``spec.capability`` GPUs; None for no ceiling.
        guarantee_gpus: ``spec.guarantee`` GPUs, kept for it whatever other queues ask.
        reclaimable: whether other queues may reclaim GPUs it holds beyond its deserved share.
        elastic: whether jobs without an explicit queue that are elastic default to this queue
            (the first elastic queue), and non-elastic ones to the first queue with False.
    """

    name: QueueName
    weight: float = 1.0
    capability_gpus: float | None = None
    guarantee_gpus: float = 0.0
    reclaimable: bool = True
    elastic: bool = True


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A cluster of identical GPU nodes and its queues.

    Attributes:
        name: a label for reports.
        nodes: number of nodes.
        gpus_per_node: GPUs on each node.
        queues: the Volcano Queues.
        reclaim: whether the scheduler's ``reclaim`` action is enabled.
        restart_cost_s: default seconds without progress after a membership change.
        overcommit_factor: the overcommit plugin's factor for the enqueue gate.
    """

    name: str
    nodes: int
    gpus_per_node: int
    queues: tuple[QueueSpec, ...]
    reclaim: bool = True
    restart_cost_s: float = 30.0
    overcommit_factor: float = 1.2

    @property
    def total_gpus(self) -> int:
        """Every GPU in the cluster."""
        return self.nodes * self.gpus_per_node

    def queue(self, name: QueueName) -> QueueSpec | None:
        """The queue called ``name``, or None."""
        for queue in self.queues:
            if queue.name == name:
                return queue
        return None

    def real_capability(self, healthy_gpus: float) -> dict[QueueName, float]:
        """The most GPUs each queue may hold: Volcano's real capability.

        Args:
            healthy_gpus: the GPUs of the cluster's healthy nodes.

        Returns:
            Each queue's capability (or every healthy GPU), less the other queues' guarantees,
            never below 0.
        """
        guaranteed = sum(q.guarantee_gpus for q in self.queues)
        out: dict[QueueName, float] = {}
        for q in self.queues:
            cap = healthy_gpus - guaranteed + q.guarantee_gpus
            if q.capability_gpus is not None:
                cap = min(cap, q.capability_gpus)
            out[q.name] = max(0.0, cap)
        return out

    def default_queue(self, *, elastic: bool) -> QueueName:
        """The queue a job without one goes to: the first queue whose ``elastic`` matches."""
        for queue in self.queues:
            if queue.elastic == elastic:
                return queue.name
        return self.queues[0].name


BUILTIN_CLUSTER = ClusterSpec(
    name="small-mixed",
    nodes=8,
    gpus_per_node=4,
    queues=(
        QueueSpec(QueueName("research"), weight=2.0, reclaimable=True, elastic=True),
        QueueSpec(
            QueueName("production"),
            weight=1.0,
            guarantee_gpus=8.0,
            reclaimable=False,
            elastic=False,
        ),
    ),
)
"""The default: 8 nodes x 4 GPUs, an elastic ``research`` queue (weight 2) and a non-elastic
``production`` queue (weight 1, 8 GPUs guaranteed, not reclaimable)."""


MAX_NODES = 100_000
"""Most nodes a cluster file may have: the simulator keeps a list entry per node (the largest
GPU clusters in service have some tens of thousands)."""
MAX_GPUS_PER_NODE = 1024


def _number(data: Mapping[str, Any], key: str, where: str, problems: list[str]) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        problems.append(f"{where}.{key}: must be a number, got {value!r}")
        return None
    if value < 0:
        problems.append(f"{where}.{key}: must be >= 0, got {value!r}")
        return None
    return float(value)


def parse_cluster(data: Any, *, source: str) -> ClusterSpec:
    """Build a ClusterSpec from parsed YAML.

    Args:
        data: the parsed document.
        source: the file name, for messages.

    Returns:
        The cluster.

    Raises:
        ClusterFileError: with every problem found, each naming its path and value.
    """
    problems: list[str] = []
    if not isinstance(data, Mapping):
        raise ClusterFileError(source, [f"top level must be a mapping, got {type(data).__name__}"])
    known = {
        "name",
        "nodes",
        "gpus_per_node",
        "queues",
        "reclaim",
        "restart_cost_s",
        "overcommit_factor",
    }
    problems += [f"{k}: unknown field" for k in data if k not in known]
    nodes, gpn = data.get("nodes"), data.get("gpus_per_node")
    for key, value, most in (
        ("nodes", nodes, MAX_NODES),
        ("gpus_per_node", gpn, MAX_GPUS_PER_NODE),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            problems.append(f"{key}: must be an integer from 1 to {most:,}, got {value!r}")
    restart = _number(data, "restart_cost_s", "cluster", problems)
    overcommit = _number(data, "overcommit_factor", "cluster", problems)
    reclaim = data.get("reclaim", True)
    if not isinstance(reclaim, bool):
        problems.append(f"reclaim: must be true or false, got {reclaim!r}")
    raw_queues = data.get("queues")
    queues: list[QueueSpec] = []
    if not isinstance(raw_queues, list) or not raw_queues:
        problems.append(f"queues: must be a non-empty list, got {raw_queues!r}")
        raw_queues = []
    names: set[str] = set()
    queue_fields = {"name", "weight", "capability_gpus", "guarantee_gpus", "reclaimable", "elastic"}
    for i, raw in enumerate(raw_queues):
        where = f"queues[{i}]"
        if not isinstance(raw, Mapping):
            problems.append(f"{where}: must be a mapping, got {raw!r}")
            continue
        problems += [f"{where}.{k}: unknown field" for k in raw if k not in queue_fields]
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            problems.append(f"{where}.name: must be a non-empty string, got {name!r}")
            continue
        if name in names:
            problems.append(f"{where}.name: duplicate queue {name!r}")
        names.add(name)
        weight = _number(raw, "weight", where, problems)
        if weight == 0:
            problems.append(f"{where}.weight: must be > 0, got 0")
        flags = {k: raw.get(k, True) for k in ("reclaimable", "elastic")}
        for key, value in flags.items():
            if not isinstance(value, bool):
                problems.append(f"{where}.{key}: must be true or false, got {value!r}")
        queues.append(
            QueueSpec(
                name=QueueName(name),
                weight=weight or 1.0,
                capability_gpus=_number(raw, "capability_gpus", where, problems),
                guarantee_gpus=_number(raw, "guarantee_gpus", where, problems) or 0.0,
                reclaimable=bool(flags["reclaimable"]),
                elastic=bool(flags["elastic"]),
            )
        )
    if not problems and isinstance(nodes, int) and isinstance(gpn, int):
        total = nodes * gpn
        guaranteed = sum(q.guarantee_gpus for q in queues)
        if guaranteed > total:
            problems.append(f"queues: guarantees sum to {guaranteed} GPUs, above the {total} total")
    if problems:
        raise ClusterFileError(source, problems)
    assert isinstance(nodes, int) and isinstance(gpn, int)
    name = data.get("name", Path(source).stem)
    return ClusterSpec(
        name=str(name),
        nodes=nodes,
        gpus_per_node=gpn,
        queues=tuple(queues),
        reclaim=bool(reclaim),
        restart_cost_s=30.0 if restart is None else restart,
        overcommit_factor=1.2 if overcommit is None else overcommit,
    )


def load_cluster(path: Path) -> ClusterSpec:
    """Read a cluster file (YAML).

    Args:
        path: the file.

    Returns:
        The cluster.

    Raises:
        ClusterFileError: the file is missing, not YAML, or invalid.
    """
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ClusterFileError(str(path), [f"cannot read: {e}"]) from e
    except yaml.YAMLError as e:
        raise ClusterFileError(str(path), [yaml_problem(e)]) from e
    return parse_cluster(data, source=str(path))
