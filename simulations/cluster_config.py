"""The simulated cluster's shape: nodes, GPUs per node and Volcano Queues, from YAML or built in."""

from __future__ import annotations

import difflib
import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scheduler_policy.policy.fields import (
    Converter,
    Section,
    boolean,
    duration,
    finite_number,
    format_duration,
    join_path,
    load_yaml,
    nonempty_string,
    section,
    show,
    whole_gpus,
    yaml_problem,
)
from scheduler_policy.vocabulary.state import QueueName
from simulations.errors import ClusterFileError


class NodeOrder(enum.Enum):
    """Where the scheduler puts each pod among the nodes that fit it.

    Volcano v1.15.1 as shipped orders nodes by ``nodeorder`` (least requested first): 24
    one-GPU pods of one job went 6 to each of 4 nodes. With the ``binpack`` plugin they pack
    onto the fullest node first (shared/volcano-wire/v1.15.1/README.md, "Placement").
    """

    SPREAD = "spread"
    """Each pod to the node with the most free GPUs that fits it (Volcano's default)."""
    BINPACK = "binpack"
    """Each pod to the fullest node that fits it (the ``binpack`` plugin)."""


NODE_ORDERS = tuple(order.value for order in NodeOrder)
"""The node orders' names, as a cluster file and ``--node-order`` spell them."""


def node_order(value: object, path: str) -> NodeOrder:
    """A node order by its name.

    Args:
        value: the name, ``spread`` or ``binpack``.
        path: where it was given, for the message (``nodeOrder``, ``--node-order``).

    Returns:
        The node order.

    Raises:
        ValueError: ``value`` names no node order; the message names ``path`` and the value.
    """
    for order in NodeOrder:
        if value == order.value:
            return order
    close = (
        difflib.get_close_matches(value.lower().replace("-", ""), NODE_ORDERS, n=1)
        if isinstance(value, str)
        else []
    )
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"{path}: must be one of {', '.join(NODE_ORDERS)}, got {show(value)}{hint}")


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


DEFAULT_SAVE_EXIT_S = 6.1
"""Seconds a worker takes from SIGTERM to exit on a graceful shrink (agree on a step, save,
exit), the default of a job that gives none: BENCHMARKS.md, "Worker runtime: checkpoints and
restarts", measured 6.09 s for one process with a 1 GB checkpoint (0.87 s at 100 MB; torchrun's
2 <-> 3 agents exited in 1.42 / 1.47 s median / max): the larger figure, rounded up."""


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
        node_order: where the scheduler puts each pod (``NodeOrder``; Volcano's default
            spreads).
        save_exit_s: default seconds the departing workers of a graceful shrink take to save
            and exit; their GPUs stay held (releasing) until then (``DEFAULT_SAVE_EXIT_S``).
    """

    name: str
    nodes: int
    gpus_per_node: int
    queues: tuple[QueueSpec, ...]
    reclaim: bool = True
    restart_cost_s: float = 30.0
    overcommit_factor: float = 1.2
    node_order: NodeOrder = NodeOrder.SPREAD
    save_exit_s: float = DEFAULT_SAVE_EXIT_S

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


KIND = "Cluster"
"""A cluster file's ``kind`` (optional; ``tide validate`` tells the file by it or its shape)."""

_TOP_KEYS = (
    "kind",
    "name",
    "nodes",
    "gpusPerNode",
    "queues",
    "reclaim",
    "restartCost",
    "overcommitFactor",
    "nodeOrder",
    "saveExit",
)
_QUEUE_KEYS = ("name", "weight", "capabilityGpus", "guaranteeGpus", "reclaimable", "elastic")
RENAMED = {
    "gpus_per_node": "gpusPerNode",
    "restart_cost_s": "restartCost",
    "overcommit_factor": "overcommitFactor",
    "capability_gpus": "capabilityGpus",
    "guarantee_gpus": "guaranteeGpus",
}
"""Keys of the old snake_case cluster files, and what they are now called."""


def _renamed(section: Section, allowed: tuple[str, ...]) -> None:
    """Replace the generic unknown-key problem of an old spelling by one giving the new key."""
    for old, new in RENAMED.items():
        if old not in section.mapping or new not in allowed:
            continue
        path = join_path(section.path, old)
        section.problems[:] = [p for p in section.problems if not p.startswith(f"{path}:")]
        unit = " (a duration such as '30s')" if new == "restartCost" else ""
        section.problems.append(f"{path}: is now spelled {new!r}{unit}")


def _count(most: int) -> Converter[int]:
    def convert(value: object, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise ValueError(f"{path}: must be an integer from 1 to {most:,}, got {show(value)}")
        return value

    return convert


def _positive(value: object, path: str) -> float:
    number = finite_number(value, path)
    if number <= 0:
        raise ValueError(f"{path}: must be > 0, got {show(value)}")
    return number


def _optional_gpus(value: object, path: str) -> float | None:
    return None if value is None else whole_gpus(value, path)


def _kind(value: object, path: str) -> str:
    if value != KIND:
        close = isinstance(value, str) and value.lower() == KIND.lower()
        hint = f"; did you mean {KIND!r}?" if close else ""
        raise ValueError(f"{path}: must be {KIND!r}, got {show(value)}{hint}")
    return KIND


def _queue(value: object, *, path: str, problems: list[str]) -> QueueSpec | None:
    queue = section(value, path=path, allowed=_QUEUE_KEYS, problems=problems)
    if queue is None:
        return None
    _renamed(queue, _QUEUE_KEYS)
    if "name" not in queue.mapping:
        problems.append(f"{path}.name: is required")
    name = queue.get("name", "", nonempty_string)
    spec = QueueSpec(
        name=QueueName(name),
        weight=queue.get("weight", 1.0, _positive),
        capability_gpus=queue.get("capabilityGpus", None, _optional_gpus),
        guarantee_gpus=queue.get("guaranteeGpus", 0.0, whole_gpus),
        reclaimable=queue.get("reclaimable", True, boolean),
        elastic=queue.get("elastic", True, boolean),
    )
    return spec if name else None


def parse_cluster(data: Any, *, source: str) -> ClusterSpec:
    """Build a ClusterSpec from a parsed cluster file (camelCase keys, durations as strings,
    as in a policy file).

    Args:
        data: the parsed document.
        source: the file name, for messages.

    Returns:
        The cluster.

    Raises:
        ClusterFileError: with every problem found, each naming its path and value; an unknown
            key gets the nearest known one, and an old snake_case key its new spelling.
    """
    problems: list[str] = []
    top = section(data, path="", allowed=_TOP_KEYS, problems=problems)
    if top is None:
        raise ClusterFileError(source, problems)
    _renamed(top, _TOP_KEYS)
    top.get("kind", KIND, _kind)
    old_names = {RENAMED[k] for k in top.mapping if k in RENAMED}  # said already
    for key in ("nodes", "gpusPerNode", "queues"):
        if key not in top.mapping and key not in old_names:
            problems.append(f"{key}: is required")
    nodes = top.get("nodes", 0, _count(MAX_NODES))
    gpn = top.get("gpusPerNode", 0, _count(MAX_GPUS_PER_NODE))
    restart = top.get("restartCost", 30.0, duration)
    overcommit = top.get("overcommitFactor", 1.2, _positive)
    reclaim = top.get("reclaim", True, boolean)
    order = top.get("nodeOrder", NodeOrder.SPREAD, node_order)
    save_exit = top.get("saveExit", DEFAULT_SAVE_EXIT_S, duration)
    queues: list[QueueSpec] = []
    raw_queues = top.mapping.get("queues")
    if "queues" in top.mapping and (not isinstance(raw_queues, list) or not raw_queues):
        problems.append(f"queues: must be a non-empty list of queues, got {show(raw_queues)}")
    first: dict[str, str] = {}
    for i, raw in enumerate(raw_queues if isinstance(raw_queues, list) else []):
        path = f"queues[{i}]"
        queue = _queue(raw, path=path, problems=problems)
        if queue is None:
            continue
        if queue.name in first:
            problems.append(
                f"{path}.name: duplicate queue {queue.name!r}, first at {first[queue.name]}"
            )
            continue
        first[queue.name] = path
        queues.append(queue)
    if not problems:
        total = nodes * gpn
        guaranteed = sum(q.guarantee_gpus for q in queues)
        if guaranteed > total:
            problems.append(
                f"queues: guarantees sum to {guaranteed:g} GPUs, above the cluster's {total}"
            )
    if problems:
        raise ClusterFileError(source, problems)
    name = top.get("name", Path(source).stem, nonempty_string)
    return ClusterSpec(
        name=name,
        nodes=nodes,
        gpus_per_node=gpn,
        queues=tuple(queues),
        reclaim=reclaim,
        restart_cost_s=restart,
        overcommit_factor=overcommit,
        node_order=order,
        save_exit_s=save_exit,
    )


def cluster_document(cluster: ClusterSpec) -> dict[str, Any]:
    """``cluster`` as the document of a cluster file, which ``parse_cluster`` reads back as
    ``cluster`` (a report records the cluster that ran in the spelling a user writes)."""

    def number(value: float) -> float | int:
        return int(value) if float(value).is_integer() else value

    queues = []
    for q in cluster.queues:
        queue: dict[str, Any] = {"name": q.name, "weight": number(q.weight)}
        if q.capability_gpus is not None:
            queue["capabilityGpus"] = number(q.capability_gpus)
        queue["guaranteeGpus"] = number(q.guarantee_gpus)
        queue["reclaimable"] = q.reclaimable
        queue["elastic"] = q.elastic
        queues.append(queue)
    return {
        "kind": KIND,
        "name": cluster.name,
        "nodes": cluster.nodes,
        "gpusPerNode": cluster.gpus_per_node,
        "reclaim": cluster.reclaim,
        "restartCost": format_duration(cluster.restart_cost_s),
        "overcommitFactor": number(cluster.overcommit_factor),
        "nodeOrder": cluster.node_order.value,
        "saveExit": format_duration(cluster.save_exit_s),
        "queues": queues,
    }


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
        data = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ClusterFileError(str(path), [f"cannot read: {e}"]) from e
    except yaml.YAMLError as e:
        raise ClusterFileError(str(path), [yaml_problem(e)]) from e
    return parse_cluster(data, source=str(path))
