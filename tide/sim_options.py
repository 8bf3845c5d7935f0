"""What ``tide simulate``, ``tide compare`` and ``tide tune`` share: their options, the run
options and the workloads those give, and the console they print on."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from scheduler_policy.policy.spec import ElasticPolicy
from simulations.api import (
    SEEDED_FORMATS,
    Seeded,
    detect_format,
    load_workload,
    policy_queue_warnings,
    time_window,
)
from simulations.cluster_config import ClusterSpec, node_order
from simulations.errors import SimulationError
from simulations.faults import FaultOptions
from simulations.run import RunOptions
from simulations.workload import DEFAULT_DURATION_S, DEFAULT_LOAD, Workload

DEFAULT_DURATION_H = DEFAULT_DURATION_S / 3600

console = Console()

TraceOpt = Annotated[
    Path | None,
    typer.Option(
        "--trace",
        help="Trace file (tide CSV/JSONL, Pollux, Philly, ITP tarball); default: the built-in "
        "workload, whose elastic jobs go to the cluster's first elastic queue and the others to "
        "its first non-elastic queue (its first queue if every queue is elastic).",
    ),
]
FormatOpt = Annotated[
    str, typer.Option("--format", help="Trace format: auto|tide|pollux|philly|itp.")
]
MemberOpt = Annotated[str, typer.Option("--member", help="Cluster file inside an ITP tarball.")]
ClusterOpt = Annotated[
    Path | None, typer.Option("--cluster", help="Cluster file (YAML); default: built-in 8x4 GPUs.")
]


def _node_order_flag(value: str | None) -> str | None:
    """``--node-order``'s check: a node order's name, or None (left out)."""
    if value is not None:
        try:
            node_order(value, "--node-order")
        except ValueError as e:
            raise typer.BadParameter(str(e).removeprefix("--node-order: ")) from e
    return value


NodeOrderOpt = Annotated[
    str | None,
    typer.Option(
        "--node-order",
        help="Where the scheduler puts each pod: spread (Volcano's default nodeorder: the node "
        "with the most free GPUs) or binpack (the fullest node that fits); default: the "
        "cluster file's nodeOrder, else spread. The report says which one ran.",
        metavar="spread|binpack",
        callback=_node_order_flag,
    ),
]


SeedOpt = Annotated[int, typer.Option("--seed", min=0, help="Seed of workload, noise and faults.")]
SeedsOpt = Annotated[
    str | None,
    typer.Option(
        "--seeds",
        help="Several seeds instead of --seed, e.g. 0,1,2: every policy on each seed's "
        "workload; the table shows medians over them.",
    ),
]
DurationOpt = Annotated[
    float, typer.Option("--duration", help="Arrival window of the built-in workload, hours.")
]
LoadOpt = Annotated[
    float,
    typer.Option(
        "--load",
        help="Offered load of the built-in workload: GPUs its jobs ask for, averaged over the "
        f"window, as a share of the cluster's (default {DEFAULT_LOAD:g}, a busy cluster).",
    ),
]
StartOpt = Annotated[
    float,
    typer.Option(
        "--start",
        min=0,
        help="Replay only the trace's jobs submitted from this hour on (hours from the trace's "
        "start; the replay starts there).",
    ),
]
EndOpt = Annotated[
    float | None,
    typer.Option(
        "--end",
        help="Replay only the trace's jobs submitted before this hour (hours from the trace's "
        "start), e.g. --end 168 for its first week.",
    ),
]
HorizonOpt = Annotated[
    float | None, typer.Option("--horizon", help="Stop the simulation at this time, hours.")
]
NoBoundOpt = Annotated[
    bool,
    typer.Option(
        "--no-bound",
        help="Skip the lower bound on the average JCT (a linear program: a second or so on "
        "most workloads); the output says it was skipped.",
    ),
]
NoDeclaredWorkOpt = Annotated[
    bool,
    typer.Option(
        "--no-declared-work",
        help="Hide every job's remaining work from tide's engine, even where the job declares "
        "its planned samples (a Pollux trace's jobs, the trace's declares_planned_samples "
        "column, half the built-in workload's jobs): as on a cluster whose training scripts "
        "export no tide_worker_planned_samples. optimus (oracle) still knows it.",
    ),
]
NoAdaptiveBatchOpt = Annotated[
    bool,
    typer.Option(
        "--no-adaptive-batch",
        help="Keep every job at its submitted batch under tide too. By default a job that lets "
        "tide choose its batch (every Pollux job but ncf, as Pollux's jobs are AdaptDL jobs) "
        "takes the batch its workers choose by goodput, with its work counted in Pollux's "
        "progress; the baselines always keep the submitted batch, as in Pollux's comparison. "
        "The report says which model each policy ran.",
    ),
]
ProfilesOpt = Annotated[
    Path | None,
    typer.Option(
        "--profiles",
        help="Folder of Pollux's application profiles (one <application>/ folder with "
        "placements.csv, scalability.csv, validation-<batch>.csv each); default: "
        "<trace>/../../traces, where Pollux's repository keeps them. Pollux traces only.",
        metavar="DIR",
    ),
]
SkipOpt = Annotated[
    bool, typer.Option("--skip-bad-rows", help="Skip and count bad trace rows instead of failing.")
]


def _unwritable(path: Path, *, folder: bool) -> str | None:
    """Why the command could not write ``path`` (a folder, or a file), found without creating
    anything; None when it can. Checked before anything runs: a simulation that ran for
    minutes must not end in a traceback for want of somewhere to write."""
    if not folder and path.is_dir():
        return f"{path} is a folder, not a file"
    if not folder and path.exists():
        try:  # append mode changes nothing; os.access says yes to root on a read-only mount
            with path.open("a"):
                pass
        except OSError as e:
            return f"{path} is not writable ({e.strerror or e})"
        return None
    nearest = path if folder else path.parent
    while not nearest.exists():  # the folders to be made go under the nearest that exists
        nearest = nearest.parent
    if not nearest.is_dir():
        return f"{nearest} is a file, not a folder"
    if folder and path.exists():
        return None if _can_create_in(path) else f"{path} is not writable"
    # Try what the command will do, in the nearest folder that exists, and undo it: /proc
    # and read-only mounts pass os.access for root but refuse a new folder.
    return None if _can_create_in(nearest) else f"cannot create {path}: {nearest} is not writable"


def _can_create_in(folder: Path) -> bool:
    """Whether a folder can be made in ``folder`` (it is removed at once)."""
    try:
        probe = tempfile.mkdtemp(prefix=".tide-probe-", dir=folder)
    except OSError:
        return False
    os.rmdir(probe)
    return True


def writable_folder(path: Path) -> Path:
    """``--out``'s check: a folder the command can write in (made when it runs)."""
    problem = _unwritable(path, folder=True)
    if problem is not None:
        raise typer.BadParameter(problem)
    return path


def writable_file(path: Path | None) -> Path | None:
    """``--json``'s check: a file the command can write (its folders made when it runs)."""
    problem = None if path is None else _unwritable(path, folder=False)
    if problem is not None:
        raise typer.BadParameter(problem)
    return path


OutOpt = Annotated[
    Path,
    typer.Option("--out", help="Folder for the report and plots.", callback=writable_folder),
]
JsonOpt = Annotated[
    Path | None,
    typer.Option("--json", help="Also write the JSON report here.", callback=writable_file),
]
MtbfOpt = Annotated[
    float | None, typer.Option("--node-mtbf", help="Mean time between failures per node, hours.")
]
OutageOpt = Annotated[
    float | None,
    typer.Option("--metrics-outage-every", help="Mean time between metrics outages, hours."),
]
SimWorkersOpt = Annotated[
    int | None,
    typer.Option(
        "--workers",
        min=1,
        help="Processes the policies run in at once; default: one per CPU, at most one per "
        "policy. The results do not depend on it.",
    ),
]
QuietOpt = Annotated[
    float | None,
    typer.Option(
        "--quiet-interval",
        help="Longest gap between reconciles while nothing "
        "happens, seconds (default: the interval).",
    ),
]


_LISTING = re.compile(r"^(?P<source>.+): \d+ problem\(s\):$")
_PLACE = re.compile(r"^(?P<place>[^ ]+?(?::\d+)?): (?P<rest>.*)$")


def error_lines(error: Exception) -> list[str]:
    """An error as every command prints it: ``FILE: error: problem`` (``FILE:LINE: error:``
    for a trace row), one line per problem; ``error: problem`` when no file is at fault.

    Args:
        error: a ``TideError`` or ``SimulationError``, whose message names the file first.

    Returns:
        The lines, none blank.
    """
    lines = [line for line in str(error).splitlines() if line.strip()]
    listing = _LISTING.match(lines[0]) if lines else None
    if listing is not None:  # "FILE: N problem(s):" then "  - problem" lines
        source = listing.group("source")
        return [f"{source}: error: {line.strip().removeprefix('- ')}" for line in lines[1:]]
    out = []
    for line in lines:
        match = _PLACE.match(line)
        place = match.group("place") if match else ""
        if match and Path(place.rsplit(":", 1)[0] if place[-1:].isdigit() else place).exists():
            out.append(f"{place}: error: {match.group('rest')}")
        elif line.startswith(("and ", "  ")) or " bad rows in all" in line:
            out.append(line)  # the tail of a list of bad rows
        else:
            out.append(f"error: {line}")
    return out


def print_error(error: Exception) -> None:
    """Print ``error`` as ``error_lines`` gives it (red ``error:``, no markup read in it)."""
    for line in error_lines(error):
        head, found, rest = line.partition("error: ")
        text = Text(head)
        if found:
            text.append("error: ", style="red")
            text.append(rest)
        console.print(text, highlight=False, soft_wrap=True)


def seed_list(text: str) -> list[int]:
    """``--seeds`` as integers: comma-separated, each >= 0, none twice.

    Raises:
        typer.BadParameter: an entry that is not a non-negative integer, or a seed given twice,
            named.
    """
    seeds = []
    for item in text.split(","):
        try:
            seed = int(item)
        except ValueError:
            seed = -1
        if seed < 0:
            raise typer.BadParameter(
                f"{item.strip()!r} is not a non-negative integer (write e.g. 0,1,2)",
                param_hint="--seeds",
            )
        seeds.append(seed)
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    if twice:
        raise typer.BadParameter(f"seed {twice[0]} is given twice", param_hint="--seeds")
    return seeds


def chosen_seeds(seed: int, seeds: str | None) -> list[int]:
    """The seeds to run: ``--seeds`` if given (then ``--seed`` must be left out), else ``--seed``.

    Raises:
        typer.BadParameter: both given, a bad entry, or a seed given twice.
    """
    if seeds is None:
        return [seed]
    if seed != 0:
        raise typer.BadParameter("give --seed or --seeds, not both", param_hint="--seeds")
    return seed_list(seeds)


def worker_count(asked: int | None, runs: int) -> int:
    """``--workers``, or one process per CPU this process may use, at most one per run."""
    if asked is not None:
        return asked
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(runs, cpus or 1))


def warn_policy(policy: ElasticPolicy, cluster: ClusterSpec) -> None:
    """Print what a user should know before simulating ``policy`` on ``cluster``."""
    for warning in policy_queue_warnings(policy, cluster):
        console.print(f"[yellow]warning:[/yellow] {warning}")


def seed_options(
    *,
    horizon_h: float | None,
    mtbf_h: float | None,
    outage_h: float | None,
    quiet_s: float | None,
    declared_work: bool = True,
    adaptive_batch: bool = True,
) -> Callable[[int], RunOptions]:
    """The run options the flags give, for each seed (its faults and measurement noise). The
    flags are checked here, before any file is read; they do not depend on the seed.
    ``declared_work`` False is ``--no-declared-work`` (``MetricsOptions.declared_work``);
    ``adaptive_batch`` False is ``--no-adaptive-batch`` (``RunOptions.adaptive_batch``).

    Raises:
        typer.BadParameter: a flag that is not a finite positive number, named with its unit
            and what leaving it out means.
    """
    for flag, value, unit, unset in (
        ("--horizon", horizon_h, "hours", "to run every job to its end"),
        ("--node-mtbf", mtbf_h, "hours", "for no node failures"),
        ("--metrics-outage-every", outage_h, "hours", "for no outages"),
        ("--quiet-interval", quiet_s, "seconds", "for the policy's interval"),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise typer.BadParameter(
                f"must be a finite number of {unit} > 0, got {value:g} (leave it out {unset})",
                param_hint=flag,
            )

    def options(seed: int) -> RunOptions:
        faults = FaultOptions(
            node_mtbf_s=mtbf_h * 3600 if mtbf_h is not None else None,
            outage_every_s=outage_h * 3600 if outage_h is not None else None,
            seed=seed,
        )
        base = RunOptions()
        return RunOptions(
            horizon_s=horizon_h * 3600 if horizon_h is not None else None,
            faults=faults,
            metrics=dataclasses.replace(base.metrics, seed=seed, declared_work=declared_work),
            quiet_interval_s=quiet_s,
            adaptive_batch=adaptive_batch,
        )

    options(0)  # FaultOptions and RunOptions check their own fields too
    return options


def seeded_workloads(
    *,
    trace: Path | None,
    fmt: str,
    member: str,
    seeds: list[int],
    cluster: ClusterSpec,
    duration_h: float,
    load: float,
    skip_bad_rows: bool,
    options: Callable[[int], RunOptions],
    start_h: float = 0.0,
    end_h: float | None = None,
    profiles: Path | None = None,
) -> list[Seeded]:
    """Each seed's workload (``trace``, or the built-in workload's draw when it is None) with
    that seed's run options (its measurement noise and faults); of a trace, only the jobs
    submitted between ``start_h`` and ``end_h`` (``time_window``); a Pollux trace's application
    profiles come from ``profiles`` when given.

    Philly and ITP traces give each job an elasticity and a job type by seed, so they are read
    once per seed; the other formats' jobs are the same whatever the seed, so they are read once.
    """

    if trace is None and (start_h or end_h is not None):
        raise SimulationError(
            "--start/--end select a window of a --trace; the built-in workload's window is "
            "--duration"
        )
    window = start_h > 0 or end_h is not None

    def read(seed: int) -> Workload:
        workload = load_workload(
            trace=trace,
            trace_format=fmt,
            member=member,
            seed=seed,
            duration_s=duration_h * 3600,
            load=load,
            cluster_gpus=cluster.total_gpus,
            skip_bad_rows=skip_bad_rows,
            pollux_traces=profiles,
            gpus_per_node=cluster.gpus_per_node,
        )
        if not window:
            return workload
        return time_window(
            workload, start_s=start_h * 3600, end_s=None if end_h is None else end_h * 3600
        )

    seed_free = trace is not None and (
        (detect_format(trace) if fmt == "auto" else fmt) not in SEEDED_FORMATS
    )
    if seed_free and seeds:
        once = read(seeds[0])
        return [Seeded(s, once, options(s)) for s in seeds]
    return [Seeded(s, read(s), options(s)) for s in seeds]


LONG_TRACE_DAYS = 7.0
"""Arrivals spanning more days than this get the ``--quiet-interval`` tip."""


def long_trace_tip(workloads: list[Workload], quiet_s: float | None) -> None:
    """Point a long replay without ``--quiet-interval`` at it (once, for the longest)."""
    if quiet_s is not None:
        return
    days = max(
        (
            (max(j.submit_s for j in w.jobs) - min(j.submit_s for j in w.jobs)) / 86400.0
            for w in workloads
            if w.jobs
        ),
        default=0.0,
    )
    if days > LONG_TRACE_DAYS:
        console.print(
            f"[dim]tip: arrivals span {days:.0f} days; --quiet-interval 600 lets reconciles "
            "space out to 10 minutes while nothing happens: faster on long traces, with the "
            "engine deciding less often while the cluster is quiet[/dim]"
        )
