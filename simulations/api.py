"""The simulator's entry points for the CLI and benchmarks: load, run, compare, write reports."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from scheduler_policy.policy.spec import ElasticPolicy, QueuePolicy
from simulations.cluster_config import ClusterSpec, NodeOrder, node_order
from simulations.controllers import make_controller
from simulations.errors import SimulationError
from simulations.parallel import results_as_done
from simulations.pollux import load_pollux_workload
from simulations.report import Summary, summarize
from simulations.run import Progress, RunOptions, SimResult, simulate
from simulations.traces import load_itp, load_philly, load_tide_trace
from simulations.workload import DEFAULT_DURATION_S, DEFAULT_LOAD, Workload, generate_workload

logger = logging.getLogger(__name__)

SHARED_TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
"""Where the shared public traces live next to the checkout (never copied into the repo)."""

TRACE_FORMATS = ("auto", "tide", "pollux", "philly", "itp")

SEEDED_FORMATS = ("philly", "itp")
"""Trace formats whose jobs get their elasticity and job type from the seed."""


def default_policy_for(cluster: ClusterSpec) -> ElasticPolicy:
    """tide's default policy for a cluster: every setting at its built-in default, each of the
    cluster's queues managed, the elastic ones scaled and borrowing idle GPUs (a non-elastic
    queue does not borrow: it would have no effect). On the built-in cluster it is
    ``manifests/policies/default.yaml``."""
    return ElasticPolicy(
        name="default",
        queues=tuple(
            QueuePolicy(name=q.name, elastic=q.elastic, borrow=q.elastic) for q in cluster.queues
        ),
    )


def with_node_order(
    cluster: ClusterSpec, order: NodeOrder | str | None, *, source: str = "--node-order"
) -> ClusterSpec:
    """``cluster`` with the scheduler's node order set (``NodeOrder``: spread, Volcano's
    default, or binpack); ``cluster`` as it is for None.

    Args:
        cluster: the cluster (from its file, or built in).
        order: the node order, or its name.
        source: where ``order`` was given, for the message.

    Returns:
        The cluster with that node order.

    Raises:
        SimulationError: ``order`` names no node order (the message names ``source`` and it).
    """
    if order is None:
        return cluster
    if not isinstance(order, NodeOrder):
        try:
            order = node_order(order, source)
        except ValueError as e:
            raise SimulationError(str(e)) from e
    return replace(cluster, node_order=order)


def policy_queue_warnings(policy: ElasticPolicy, cluster: ClusterSpec) -> list[str]:
    """What a user should know before simulating ``policy`` on ``cluster``.

    Returns:
        A warning when the policy names queues the cluster lacks, or scales none of its queues
        (tide then changes nothing and runs as Volcano does on its own).
    """
    names = {q.name for q in cluster.queues}
    missing = [q.name for q in policy.queues if q.name not in names]
    scaled = [q.name for q in policy.queues if q.name in names and q.elastic]
    warnings = []
    if missing:
        warnings.append(
            f"policy {policy.name} names queue(s) {', '.join(missing)} that cluster "
            f"{cluster.name} lacks (it has {', '.join(sorted(names))})"
        )
    if not scaled:
        warnings.append(
            f"policy {policy.name} scales none of cluster {cluster.name}'s queues: tide will "
            "change nothing and run as Volcano does on its own"
        )
    return warnings


def detect_format(path: Path) -> str:
    """Guess a trace's format from its name and header line.

    Raises:
        SimulationError: the header matches no known format.
    """
    if path.name.endswith((".tar.gz", ".tgz")):
        return "itp"
    if path.suffix == ".jsonl":
        return "tide"
    try:
        with path.open(encoding="utf-8") as f:
            header = f.readline().strip().split(",")
    except OSError as e:
        raise SimulationError(f"{path}: cannot read: {e}") from e
    if header[:5] == ["name", "time", "application", "num_replicas", "batch_size"]:
        return "pollux"
    if header[:3] == ["timestamp", "duration", "num_gpus"]:
        return "philly"
    if "job_id" in header and "submit_s" in header:
        return "tide"
    if header == [""]:
        raise SimulationError(f"{path}: empty file (a trace starts with its header line)")
    raise SimulationError(f"{path}:1: unknown trace header {','.join(header)}")


def check_profiles_dir(path: Path, *, given: bool = True) -> Path:
    """``path`` if it is a Pollux profiles folder: a directory with at least one
    ``<application>/placements.csv``.

    Args:
        path: the folder.
        given: whether the user named it (``--profiles``); the message says where it came from.

    Returns:
        ``path``.

    Raises:
        SimulationError: the folder is missing, not a directory or holds no application.
    """
    where = (
        f"profiles folder {path}"
        if given
        else f"Pollux profiles folder {path} (the default, <trace>/../../traces; --profiles DIR "
        "names another)"
    )
    if not path.exists():
        raise SimulationError(f"{where}: does not exist")
    if not path.is_dir():
        raise SimulationError(f"{where}: is not a directory")
    if not any((child / "placements.csv").is_file() for child in path.iterdir()):
        raise SimulationError(
            f"{where}: holds no application profile (no <application>/placements.csv)"
        )
    return path


def load_workload(
    *,
    trace: Path | None = None,
    trace_format: str = "auto",
    member: str = "cluster04.csv",
    seed: int = 0,
    duration_s: float = DEFAULT_DURATION_S,
    load: float = DEFAULT_LOAD,
    cluster_gpus: int = 32,
    elastic_fraction: float = 0.5,
    skip_bad_rows: bool = False,
    pollux_traces: Path | None = None,
    gpus_per_node: int = 4,
) -> Workload:
    """The workload to replay: the built-in generator when ``trace`` is None.

    Args:
        trace: a trace file (for ``itp``, the tarball).
        trace_format: one of TRACE_FORMATS.
        member: the cluster file inside an ITP tarball.
        seed: seeds the generator and the job-type/elasticity choices of duration traces.
        duration_s: arrival window of the built-in workload.
        load: offered load of the built-in workload, a share of ``cluster_gpus``.
        cluster_gpus: GPUs of the cluster the built-in workload is for.
        elastic_fraction: share of elastic jobs (built-in, Philly, ITP).
        skip_bad_rows: skip and count bad rows instead of failing.
        pollux_traces: Pollux's ``traces/`` folder, one folder of profiles per application
            (default: ``<trace>/../../traces``, where Pollux's repository keeps it).
        gpus_per_node: node size, for Pollux's placement-dependent profiles.

    Returns:
        The workload.

    Raises:
        SimulationError: an unreadable trace or a bad row (file and line), a missing or invalid
            profiles folder (named), profiles given for a trace that is not Pollux's, or a
            built-in workload asked for with a load, cluster size or window that is not positive.
    """
    if trace is None:
        try:
            return generate_workload(
                seed=seed,
                duration_s=duration_s,
                load=load,
                cluster_gpus=cluster_gpus,
                elastic_fraction=elastic_fraction,
            )
        except ValueError as e:
            raise SimulationError(f"built-in workload: {e}") from e
    fmt = detect_format(trace) if trace_format == "auto" else trace_format
    if pollux_traces is not None and fmt != "pollux":
        raise SimulationError(
            f"profiles folder {pollux_traces} given, but {trace} is a {fmt} trace: only Pollux "
            "traces read application profiles"
        )
    if fmt == "pollux":
        traces_dir = check_profiles_dir(
            pollux_traces or trace.resolve().parent.parent / "traces",
            given=pollux_traces is not None,
        )
        workload = load_pollux_workload(
            trace, traces_dir=traces_dir, gpus_per_node=gpus_per_node, skip_bad_rows=skip_bad_rows
        )
    elif fmt == "philly":
        workload = load_philly(
            trace, seed=seed, elastic_fraction=elastic_fraction, skip_bad_rows=skip_bad_rows
        )
    elif fmt == "itp":
        workload = load_itp(
            trace,
            member=member,
            seed=seed,
            elastic_fraction=elastic_fraction,
            skip_bad_rows=skip_bad_rows,
        )
    elif fmt == "tide":
        workload = load_tide_trace(trace, skip_bad_rows=skip_bad_rows)
    else:
        raise SimulationError(f"unknown trace format {fmt!r}; known: {', '.join(TRACE_FORMATS)}")
    if not workload.jobs:
        # An empty replay would print a table of NaNs: almost surely the wrong file.
        skipped = f", {workload.skipped_rows} bad row(s) skipped" if workload.skipped_rows else ""
        where = f"{trace}" + (f" ({member})" if fmt == "itp" else "")
        raise SimulationError(f"{where}: no jobs to replay{skipped}")
    return workload


def time_window(workload: Workload, *, start_s: float, end_s: float | None) -> Workload:
    """The jobs of ``workload`` submitted in ``[start_s, end_s)``, their times shifted so that
    the window starts at 0 (a replay of days 3 to 5 starts at once, not after two idle days).

    Args:
        workload: the jobs, as read.
        start_s: the window's start, seconds from the trace's start (0: from its beginning).
        end_s: its end; None for the trace's end.

    Returns:
        The workload of the window, named with it (``cluster04[0-168h]``).

    Raises:
        SimulationError: a window that is empty or holds no job.
    """
    if end_s is not None and end_s <= start_s:
        raise SimulationError(
            f"--end {end_s / 3600:g} h must be after --start {start_s / 3600:g} h"
        )
    jobs = tuple(
        replace(job, submit_s=job.submit_s - start_s)
        for job in workload.jobs
        if job.submit_s >= start_s and (end_s is None or job.submit_s < end_s)
    )
    end = "" if end_s is None else f"{end_s / 3600:g}"
    window = f"{start_s / 3600:g}-{end}h"
    if not jobs:
        last = max((j.submit_s for j in workload.jobs), default=0.0) / 3600
        raise SimulationError(
            f"{workload.name}: no job is submitted in the window {window} (--start/--end); "
            f"its submissions span 0-{last:.1f} h"
        )
    return replace(workload, name=f"{workload.name}[{window}]", jobs=jobs)


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """One policy to run: a name for the report, the controller kind and tide's policy."""

    label: str
    kind: str
    policy: ElasticPolicy | None = None


def run_one(
    run: PolicyRun,
    *,
    workload: Workload,
    cluster: ClusterSpec,
    options: RunOptions,
    progress: Progress | None = None,
) -> SimResult:
    """Simulate one policy on one workload (a fresh controller).

    Args:
        run: the policy.
        workload: the jobs.
        cluster: the cluster.
        options: run options (tide's policy sets its own reconcile interval).
        progress: told the jobs finished while the run goes on (``simulate``).

    Raises:
        SimulationError: the workload does not fit the cluster (e.g. an unknown queue).
    """
    controller = make_controller(run.kind, workload=workload, policy=run.policy)
    controller.name = run.label
    interval = run.policy.interval_s if run.policy is not None else options.interval_s
    try:
        return simulate(
            workload=workload,
            cluster=cluster,
            controller=controller,
            options=replace(options, interval_s=interval),
            progress=progress,
        )
    except ValueError as e:
        raise SimulationError(str(e)) from e


@dataclass(frozen=True, slots=True)
class Seeded:
    """One seed's workload and run options, for a comparison or a tuning trial over seeds.

    Attributes:
        seed: the seed (of the workload, the measurement noise and the faults).
        workload: the jobs drawn or assigned with it.
        options: run options with it.
    """

    seed: int
    workload: Workload
    options: RunOptions


@dataclass(frozen=True, slots=True)
class Case:
    """One simulation to run: a policy on a workload, with its run options."""

    run: PolicyRun
    workload: Workload
    options: RunOptions


def _run_case(case: Case, cluster: ClusterSpec, progress: Progress | None = None) -> SimResult:
    """``run_one`` on a case, with positional arguments as a worker process is called with."""
    return run_one(
        case.run, workload=case.workload, cluster=cluster, options=case.options, progress=progress
    )


def run_cases(
    cases: Sequence[Case],
    *,
    cluster: ClusterSpec,
    on_done: Callable[[SimResult], None] | None = None,
    workers: int = 1,
    on_progress: Callable[[int, int, int, float], None] | None = None,
) -> list[SimResult]:
    """Simulate each case on the cluster.

    Each run is deterministic and independent of the others, so with ``workers`` > 1 they run
    in that many processes at once and give the same results as one after another. An error in
    one run, or an interrupt, stops the others at once (``parallel.results_as_done``).

    Args:
        cases: the runs.
        cluster: the cluster.
        on_done: called with each result as its run finishes (in finishing order).
        workers: processes to run in; 1 runs in this one, in order.
        on_progress: called with ``(index in cases, jobs finished, jobs in all, simulated
            seconds)`` while the runs go on, a few times a second per run, and once as each run
            finishes.

    Returns:
        One result per case, in the order of ``cases``.

    Raises:
        SimulationError: as ``run_one``; ValueError for ``workers`` < 1.
    """
    if workers < 1:
        raise ValueError(f"run_cases: workers must be >= 1, got {workers}")

    def done(i: int, result: SimResult) -> SimResult:
        case = cases[i]
        logger.info("%s on %s: %.1fs wall", case.run.label, case.workload.name, result.wall_s)
        if on_progress is not None:
            # From this process: a worker's last report may still be on its way.
            finished = sum(1 for job in result.jobs if job.end_s is not None)
            on_progress(i, finished, len(result.jobs), result.end_s)
        if on_done is not None:
            on_done(result)
        return result

    if workers == 1 or len(cases) < 2:
        return [
            done(
                i,
                _run_case(
                    case,
                    cluster,
                    progress=None if on_progress is None else functools.partial(on_progress, i),
                ),
            )
            for i, case in enumerate(cases)
        ]
    results: dict[int, SimResult] = {}
    calls = [(case, cluster) for case in cases]
    for i, result in results_as_done(_run_case, calls, workers=workers, on_progress=on_progress):
        results[i] = done(i, result)
    return [results[i] for i in range(len(cases))]


def run_policies(
    runs: Sequence[PolicyRun],
    *,
    workload: Workload,
    cluster: ClusterSpec,
    options: RunOptions,
    on_done: Callable[[SimResult], None] | None = None,
    workers: int = 1,
    on_progress: Callable[[int, int, int, float], None] | None = None,
) -> list[SimResult]:
    """Simulate each policy on the same workload and cluster (``run_cases``).

    Args:
        runs: the policies.
        workload: the jobs.
        cluster: the cluster.
        options: run options.
        on_done: called with each result as its run finishes (in finishing order).
        workers: processes to run in; 1 runs in this one, in order.
        on_progress: as ``run_cases``, indexed by ``runs``.

    Returns:
        One result per run, in the order of ``runs``.

    Raises:
        SimulationError: as ``run_one``; ValueError for ``workers`` < 1.
    """
    return run_cases(
        [Case(run, workload, options) for run in runs],
        cluster=cluster,
        on_done=on_done,
        workers=workers,
        on_progress=on_progress,
    )


def write_json_report(
    path: Path,
    summaries: Sequence[Summary],
    *,
    meta: dict[str, object],
    seeds: Sequence[int] | None = None,
) -> None:
    """Write the comparison as JSON: ``{"meta": ..., "summaries": [...]}``.

    Args:
        path: the file.
        summaries: the runs' summaries.
        meta: what the runs were.
        seeds: the seed of each summary, written into it as ``seed``; None for none.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    docs = [s.as_dict() for s in summaries]
    if seeds is not None:
        docs = [{**d, "seed": seed} for d, seed in zip(docs, seeds, strict=True)]
    doc = {"meta": meta, "summaries": docs}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True))


__all__ = [
    "Case",
    "NodeOrder",
    "PolicyRun",
    "Summary",
    "check_profiles_dir",
    "default_policy_for",
    "load_workload",
    "run_cases",
    "run_one",
    "run_policies",
    "summarize",
    "with_node_order",
    "write_json_report",
]
