"""``tide simulate``, ``tide compare`` and ``tide tune``: thin commands over ``simulations``."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from scheduler_policy.errors import TideError
from scheduler_policy.policy import ElasticPolicy
from scheduler_policy.policy_file import load_policy
from simulations.api import (
    SEEDED_FORMATS,
    PolicyRun,
    Seeded,
    default_policy_for,
    detect_format,
    load_workload,
    policy_queue_warnings,
)
from simulations.cluster_config import BUILTIN_CLUSTER, ClusterSpec, load_cluster
from simulations.compare import fmt as format_number
from simulations.compare import print_fitted, run_comparison
from simulations.controllers import BASELINE_NAMES
from simulations.errors import SimulationError
from simulations.faults import FaultOptions
from simulations.run import RunOptions
from simulations.tune import (
    SearchSpace,
    TuneResult,
    candidates,
    check_values,
    distinct_sets,
    load_search_space,
    policy_yaml,
    tune,
)
from simulations.workload import DEFAULT_DURATION_S, DEFAULT_LOAD, Workload

DEFAULT_DURATION_H = DEFAULT_DURATION_S / 3600

console = Console()

TraceOpt = Annotated[
    Path | None,
    typer.Option(
        "--trace",
        help="Trace file (tide CSV/JSONL, Pollux, Philly, ITP "
        "tarball); default: the built-in workload.",
    ),
]
FormatOpt = Annotated[
    str, typer.Option("--format", help="Trace format: auto|tide|pollux|philly|itp.")
]
MemberOpt = Annotated[str, typer.Option("--member", help="Cluster file inside an ITP tarball.")]
ClusterOpt = Annotated[
    Path | None, typer.Option("--cluster", help="Cluster file (YAML); default: built-in 8x4 GPUs.")
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
HorizonOpt = Annotated[
    float | None, typer.Option("--horizon", help="Stop the simulation at this time, hours.")
]
SkipOpt = Annotated[
    bool, typer.Option("--skip-bad-rows", help="Skip and count bad trace rows instead of failing.")
]
OutOpt = Annotated[Path, typer.Option("--out", help="Folder for the report and plots.")]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="Also write the JSON report here.")]
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


def _seed_list(text: str) -> list[int]:
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


def _seeds(seed: int, seeds: str | None) -> list[int]:
    """The seeds to run: ``--seeds`` if given (then ``--seed`` must be left out), else ``--seed``.

    Raises:
        typer.BadParameter: both given, a bad entry, or a seed given twice.
    """
    if seeds is None:
        return [seed]
    if seed != 0:
        raise typer.BadParameter("give --seed or --seeds, not both", param_hint="--seeds")
    return _seed_list(seeds)


def _workers(asked: int | None, runs: int) -> int:
    """``--workers``, or one process per CPU this process may use, at most one per run."""
    if asked is not None:
        return asked
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(runs, cpus or 1))


def _warn_policy(policy: ElasticPolicy, cluster: ClusterSpec) -> None:
    for warning in policy_queue_warnings(policy, cluster):
        console.print(f"[yellow]warning:[/yellow] {warning}")


def _seeded_setup(
    *,
    trace: Path | None,
    fmt: str,
    member: str,
    cluster_file: Path | None,
    seeds: list[int],
    duration_h: float,
    load: float,
    skip_bad_rows: bool,
    options: Callable[[int], RunOptions],
) -> tuple[list[Seeded], ClusterSpec]:
    """The cluster, and each seed's workload and run options (the options are checked first)."""
    checked = [options(s) for s in seeds]
    cluster = load_cluster(cluster_file) if cluster_file else BUILTIN_CLUSTER
    seeded = []
    for s, run_options in zip(seeds, checked, strict=True):
        workload = load_workload(
            trace=trace,
            trace_format=fmt,
            member=member,
            seed=s,
            duration_s=duration_h * 3600,
            load=load,
            cluster_gpus=cluster.total_gpus,
            skip_bad_rows=skip_bad_rows,
            gpus_per_node=cluster.gpus_per_node,
        )
        seeded.append(Seeded(s, workload, run_options))
    return seeded, cluster


def _options(
    *,
    seed: int,
    horizon_h: float | None,
    mtbf_h: float | None,
    outage_h: float | None,
    quiet_s: float | None,
) -> RunOptions:
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
    faults = FaultOptions(
        node_mtbf_s=mtbf_h * 3600 if mtbf_h is not None else None,
        outage_every_s=outage_h * 3600 if outage_h is not None else None,
        seed=seed,
    )
    base = RunOptions()
    return RunOptions(
        horizon_s=horizon_h * 3600 if horizon_h is not None else None,
        faults=faults,
        metrics=dataclasses.replace(base.metrics, seed=seed),
        quiet_interval_s=quiet_s,
    )


def _trace_seeds(trace: Path, fmt: str, seeds: list[int]) -> list[int]:
    """The seeds a trace is worth loading with: Philly and ITP traces give each job an
    elasticity and a job type by seed; the others are the same whatever the seed (one load)."""
    detected = detect_format(trace) if fmt == "auto" else fmt
    return seeds if detected in SEEDED_FORMATS else seeds[:1]


LONG_TRACE_DAYS = 7.0
"""Arrivals spanning more days than this get the ``--quiet-interval`` tip."""


def _long_trace_tip(workloads: list[Workload], quiet_s: float | None) -> None:
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


def _tune_workloads(
    *,
    traces: list[Path],
    fmt: str,
    member: str,
    seeds: list[int],
    cluster: ClusterSpec,
    duration_h: float,
    load: float,
    skip_bad_rows: bool,
    options: Callable[[int], RunOptions],
) -> list[Seeded]:
    """What every trial of ``tide tune`` runs on: each trace once per seed it depends on
    (``_trace_seeds``), or the built-in workload's draw for each seed. Each workload runs with
    its seed's measurement noise and faults, as ``tide simulate --seed`` runs it, so that a
    trial's figures are the ones a simulation of its policy shows.

    Raises:
        SimulationError: a trace given twice (however spelled), or one that cannot be read.
    """
    if not traces:
        return [
            Seeded(
                s,
                load_workload(
                    seed=s, duration_s=duration_h * 3600, load=load, cluster_gpus=cluster.total_gpus
                ),
                options(s),
            )
            for s in seeds
        ]
    resolved = [t.resolve() for t in traces]
    for t, r in zip(traces, resolved, strict=True):
        if resolved.count(r) > 1:
            raise SimulationError(f"--trace: {t} is given twice")
    return [
        Seeded(
            s,
            load_workload(
                trace=t,
                trace_format=fmt,
                member=member,
                seed=s,
                gpus_per_node=cluster.gpus_per_node,
                skip_bad_rows=skip_bad_rows,
            ),
            options(s),
        )
        for t in traces
        for s in _trace_seeds(t, fmt, seeds)
    ]


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _bound_text(low: float, high: float) -> str:
    if math.isinf(low):
        return f"<= {high:g}"
    return f">= {low:g}" if math.isinf(high) else f"{low:g} to {high:g}"


def _trials_table(space: SearchSpace, result: TuneResult) -> Table:
    """The best 15 trials: those that meet the constraints first, each group by objective."""
    trials = result.trials
    names = sorted({n for t in trials for n in t.params})
    bounded = [n for n in space.constraints if n != space.objective]
    done = (
        f"{len(trials)} of {result.planned} trials (interrupted)"
        if result.interrupted
        else f"{len(trials)} trials"
    )
    notes = []
    if any(n.startswith("defaults.") for n in names):
        notes.append("defaults.* parameters are shown without the prefix")
    if space.constraints:
        notes.append("rank –: misses a constraint")
    table = Table(
        title=f"tide tune: {done}, objective {space.objective}",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        caption="; ".join(notes) or None,
    )
    # Headers break at their underscores, so that every name is whole in an 80-column
    # terminal (an ellipsis would leave every "defaults." column unreadable).
    for col in ("rank", *names, space.objective, *bounded):
        header = col.removeprefix("defaults.").replace("_", "_\n")
        widest = max(map(len, header.splitlines()))
        table.add_column(header, justify="right", overflow="fold", min_width=widest)
    ranked = sorted(trials, key=lambda t: (not t.meets, t.objective))
    for rank, trial in enumerate(ranked[:15], 1):
        table.add_row(
            str(rank) if trial.meets else "–",
            *(f"{trial.params.get(n, math.nan):g}" for n in names),
            format_number(trial.objective, 3),
            *(format_number(trial.figures[n], 3) for n in bounded),
        )
    return table


def _tune_outcome(space: SearchSpace, result: TuneResult, out: Path) -> str:
    """The line after the table: where the best policy is, or why none was written."""
    trials_csv = out / "trials.csv"
    if result.best_trial is None:
        bounds = ", ".join(f"{n} {_bound_text(*b)}" for n, b in space.constraints.items())
        absent = [
            n for n in space.constraints if all(math.isnan(t.figures[n]) for t in result.trials)
        ]
        why = (
            f" ({', '.join(absent)}: no workload has this figure, e.g. no non-elastic jobs)"
            if absent
            else ""
        )
        return (
            f"no finished trial meets the constraints ({bounds}){why}; no policy written; "
            f"trials: {trials_csv}"
        )
    label = "best policy of the finished trials" if result.interrupted else "best policy"
    return f"{label}: {out / 'best-policy.yaml'}; trials: {trials_csv}"


def register(app: typer.Typer) -> None:
    """Add ``simulate``, ``compare`` and ``tune`` to the ``tide`` app."""

    @app.command()
    def simulate(
        trace: TraceOpt = None,
        fmt: FormatOpt = "auto",
        member: MemberOpt = "cluster04.csv",
        cluster_file: ClusterOpt = None,
        policy_file: Annotated[
            Path | None,
            typer.Option(
                "--policy",
                help="tide policy file; default: scale every elastic queue, borrowing idle GPUs.",
            ),
        ] = None,
        policies: Annotated[
            str,
            typer.Option(
                "--policies",
                help=f"Comma-separated: tide and baselines ({','.join(BASELINE_NAMES)}).",
            ),
        ] = "tide," + ",".join(BASELINE_NAMES),
        seed: SeedOpt = 0,
        seeds: SeedsOpt = None,
        duration_h: DurationOpt = DEFAULT_DURATION_H,
        load: LoadOpt = DEFAULT_LOAD,
        horizon_h: HorizonOpt = None,
        skip_bad_rows: SkipOpt = False,
        node_mtbf_h: MtbfOpt = None,
        outage_h: OutageOpt = None,
        quiet_s: QuietOpt = None,
        workers: SimWorkersOpt = None,
        out: OutOpt = Path("tide-sim-out"),
        json_path: JsonOpt = None,
    ) -> None:
        """Replay a workload through tide's engine and the baselines; compare them."""
        chosen = _seeds(seed, seeds)
        try:
            seeded, cluster = _seeded_setup(
                trace=trace,
                fmt=fmt,
                member=member,
                cluster_file=cluster_file,
                seeds=chosen,
                duration_h=duration_h,
                load=load,
                skip_bad_rows=skip_bad_rows,
                options=lambda s: _options(
                    seed=s,
                    horizon_h=horizon_h,
                    mtbf_h=node_mtbf_h,
                    outage_h=outage_h,
                    quiet_s=quiet_s,
                ),
            )
            policy = load_policy(policy_file) if policy_file else default_policy_for(cluster)
            _warn_policy(policy, cluster)
            runs: list[PolicyRun] = []
            for name in [p.strip() for p in policies.split(",") if p.strip()]:
                if name != "tide" and name not in BASELINE_NAMES:
                    raise SimulationError(f"--policies: unknown policy {name!r}")
                if any(run.label == name for run in runs):
                    raise SimulationError(f"--policies: {name} is given twice")
                runs.append(PolicyRun(name, name, policy if name == "tide" else None))
            _long_trace_tip([seeded[0].workload], quiet_s)
            run_comparison(
                console=console,
                runs=runs,
                seeded=seeded,
                cluster=cluster,
                out_dir=out,
                json_path=json_path,
                workers=_workers(workers, len(runs) * len(seeded)),
            )
        except (SimulationError, TideError) as e:
            console.print(f"[red]error:[/red] {e}")
            raise typer.Exit(1) from e

    @app.command()
    def compare(
        policy_files: Annotated[list[Path], typer.Argument(help="tide policy files to compare.")],
        trace: TraceOpt = None,
        fmt: FormatOpt = "auto",
        member: MemberOpt = "cluster04.csv",
        cluster_file: ClusterOpt = None,
        seed: SeedOpt = 0,
        seeds: SeedsOpt = None,
        duration_h: DurationOpt = DEFAULT_DURATION_H,
        load: LoadOpt = DEFAULT_LOAD,
        horizon_h: HorizonOpt = None,
        skip_bad_rows: SkipOpt = False,
        quiet_s: QuietOpt = None,
        workers: SimWorkersOpt = None,
        out: OutOpt = Path("tide-compare-out"),
        json_path: JsonOpt = None,
    ) -> None:
        """Run several tide policy files side by side on the same workload."""
        chosen = _seeds(seed, seeds)
        try:
            seeded, cluster = _seeded_setup(
                trace=trace,
                fmt=fmt,
                member=member,
                cluster_file=cluster_file,
                seeds=chosen,
                duration_h=duration_h,
                load=load,
                skip_bad_rows=skip_bad_rows,
                options=lambda s: _options(
                    seed=s, horizon_h=horizon_h, mtbf_h=None, outage_h=None, quiet_s=quiet_s
                ),
            )
            runs: list[PolicyRun] = []
            stems = [path.stem for path in policy_files]
            for path in policy_files:
                policy = load_policy(path)
                _warn_policy(policy, cluster)
                # Two files of one name (in different folders) are told apart by their paths.
                label = path.stem if stems.count(path.stem) == 1 else str(path)
                if any(run.label == label for run in runs):
                    raise SimulationError(f"{path}: given twice")
                runs.append(PolicyRun(label, "tide", policy))
            _long_trace_tip([seeded[0].workload], quiet_s)
            run_comparison(
                console=console,
                runs=runs,
                seeded=seeded,
                cluster=cluster,
                out_dir=out,
                json_path=json_path,
                workers=_workers(workers, len(runs) * len(seeded)),
            )
        except (SimulationError, TideError) as e:
            console.print(f"[red]error:[/red] {e}")
            raise typer.Exit(1) from e

    @app.command(name="tune")
    def tune_command(
        space_file: Annotated[Path, typer.Argument(help="Search space (YAML).")],
        traces: Annotated[
            list[Path] | None,
            typer.Option(
                "--trace", help="Trace file(s); repeat for several; default: the built-in workload."
            ),
        ] = None,
        seeds: Annotated[
            str,
            typer.Option(
                "--seeds",
                help="Workload seeds, e.g. 0,1,2: the built-in workload's draws, or which jobs "
                "of a Philly or ITP trace are elastic (other traces do not depend on it); each "
                "workload also gets its seed's measurement noise and faults.",
            ),
        ] = "0",
        fmt: FormatOpt = "auto",
        member: MemberOpt = "cluster04.csv",
        cluster_file: ClusterOpt = None,
        policy_file: Annotated[
            Path | None, typer.Option("--policy", help="Base policy whose parameters vary.")
        ] = None,
        workers: Annotated[int, typer.Option("--workers", min=1, help="Worker processes.")] = 2,
        duration_h: DurationOpt = DEFAULT_DURATION_H,
        load: LoadOpt = DEFAULT_LOAD,
        horizon_h: HorizonOpt = None,
        skip_bad_rows: SkipOpt = False,
        node_mtbf_h: MtbfOpt = None,
        outage_h: OutageOpt = None,
        quiet_s: QuietOpt = None,
        out: Annotated[
            Path,
            typer.Option("--out", help="Folder for best-policy.yaml, trials.csv and trials.json."),
        ] = Path("tide-tune-out"),
    ) -> None:
        """Search policy parameters; write the best policy and a table of trials."""
        try:
            chosen = _seed_list(seeds)

            def options(seed: int) -> RunOptions:
                return _options(
                    seed=seed,
                    horizon_h=horizon_h,
                    mtbf_h=node_mtbf_h,
                    outage_h=outage_h,
                    quiet_s=quiet_s,
                )

            options(chosen[0])  # checked before any file is read
            space = load_search_space(space_file)
            cluster = load_cluster(cluster_file) if cluster_file else BUILTIN_CLUSTER
            base = load_policy(policy_file) if policy_file else default_policy_for(cluster)
            _warn_policy(base, cluster)
            check_values(space, base)
            seeded = _tune_workloads(
                traces=traces or [],
                fmt=fmt,
                member=member,
                seeds=chosen,
                cluster=cluster,
                duration_h=duration_h,
                load=load,
                skip_bad_rows=skip_bad_rows,
                options=options,
            )
            _long_trace_tip([one.workload for one in seeded], quiet_s)
            if space.method == "random" and distinct_sets(space) < space.trials:
                console.print(
                    f"note: the search space holds {distinct_sets(space):.0f} parameter sets, "
                    f"fewer than the {space.trials} trials asked for: each runs once"
                )
            with Progress(
                TextColumn("tuning"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                auto_refresh=False,  # no refresh thread while worker processes are forked
            ) as progress:
                task = progress.add_task("tune", total=len(candidates(space)))
                progress.refresh()
                # The bar counts finished trials, and the share of each running trial's jobs
                # finished so far: a trial on a long trace takes minutes.
                running: dict[int, float] = {}
                ended: set[int] = set()

                def show() -> None:
                    progress.update(task, completed=len(ended) + sum(running.values()))
                    progress.refresh()

                def on_trial(done: int, total: int, index: int) -> None:
                    ended.add(index)
                    running.pop(index, None)
                    show()

                def on_progress(index: int, share: float) -> None:
                    if index not in ended:  # a report can arrive after its trial's result
                        running[index] = share
                        show()

                result = tune(
                    space=space,
                    base_policy=base,
                    seeded=seeded,
                    cluster=cluster,
                    out_dir=out,
                    workers=workers,
                    on_trial=on_trial,
                    on_progress=on_progress,
                )
        except KeyboardInterrupt:
            console.print(f"interrupted; finished trials are in {out / 'trials.csv'}")
            raise typer.Exit(130) from None
        except (SimulationError, TideError) as e:
            console.print(f"[red]error:[/red] {e}")
            raise typer.Exit(1) from e
        trials = result.trials
        if not trials:
            console.print("interrupted before any trial finished; no policy written")
            raise typer.Exit(130)
        best_file = out / "best-policy.yaml"
        if result.best_trial is not None:
            best_policy = dataclasses.replace(result.best, name=f"{base.name}-tuned")
            best_file.write_text(policy_yaml(best_policy))
        else:
            best_file.unlink(missing_ok=True)  # a file from an earlier search is not this one's
        print_fitted(console, _trials_table(space, result))
        console.print(_tune_outcome(space, result, out))
        (out / "trials.json").write_text(
            json.dumps(
                [
                    {
                        "trial": t.index,
                        "params": t.params,
                        "objective": _json_number(t.objective),
                        **(
                            {
                                "figures": {n: _json_number(v) for n, v in t.figures.items()},
                                "meets_constraints": t.meets,
                            }
                            if space.constraints
                            else {}
                        ),
                    }
                    for t in trials
                ]
            )
        )
        if result.interrupted:
            raise typer.Exit(130)
        if result.best_trial is None:
            raise typer.Exit(1)
