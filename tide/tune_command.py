"""``tide tune``: a thin command over ``simulations.tune``."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from scheduler_policy.policy.file import load_policy, policy_yaml
from scheduler_policy.policy.spec import ElasticPolicy
from scheduler_policy.vocabulary.errors import TideError
from simulations.api import Seeded, default_policy_for, detect_format, with_node_order
from simulations.bounds import jct_lower_bounds_h
from simulations.cluster_config import BUILTIN_CLUSTER, ClusterSpec, load_cluster
from simulations.errors import SimulationError
from simulations.run import RunOptions
from simulations.tune import (
    Trial,
    TuneResult,
    tune,
)
from simulations.tune_space import (
    SearchSpace,
    candidates,
    check_values,
    distinct_sets,
    load_search_space,
    param_text,
    param_value,
    parameter,
)
from simulations.workload import DEFAULT_LOAD
from tide.comparison import BOUND_TERMS, NO_BOUND, print_fitted
from tide.comparison_lines import fmt as format_number
from tide.sim_options import (
    DEFAULT_DURATION_H,
    ClusterOpt,
    DurationOpt,
    EndOpt,
    FormatOpt,
    HorizonOpt,
    LoadOpt,
    MemberOpt,
    MtbfOpt,
    NoAdaptiveBatchOpt,
    NoBoundOpt,
    NoDeclaredWorkOpt,
    NodeOrderOpt,
    OutageOpt,
    ProfilesOpt,
    QuietOpt,
    SkipOpt,
    StartOpt,
    console,
    long_trace_tip,
    print_error,
    seed_list,
    seed_options,
    seeded_workloads,
    warn_policy,
    worker_count,
    writable_folder,
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
    start_h: float = 0.0,
    end_h: float | None = None,
    profiles: Path | None = None,
) -> list[Seeded]:
    """What every trial of ``tide tune`` runs on: each trace, or the built-in workload's draw,
    at each seed. Each runs with its seed's measurement noise and faults (and, on Philly and
    ITP traces, its elastic jobs and job types), as ``tide simulate --seeds`` runs it, so that
    a trial's figures are the ones a simulation of its policy shows. ``profiles`` serves the
    Pollux traces among them.

    Raises:
        SimulationError: a trace given twice (however spelled), one that cannot be read, or
            ``profiles`` given without a Pollux trace.
    """
    resolved = [t.resolve() for t in traces]
    for t, r in zip(traces, resolved, strict=True):
        if resolved.count(r) > 1:
            raise SimulationError(f"--trace: {t} is given twice")
    chosen: list[Path | None] = list(traces) or [None]  # None: the built-in workload

    def is_pollux(trace: Path | None) -> bool:
        return trace is not None and (detect_format(trace) if fmt == "auto" else fmt) == "pollux"

    if profiles is not None and not any(is_pollux(t) for t in chosen):
        raise SimulationError(
            f"--profiles {profiles}: no --trace is a Pollux trace, and only those read profiles"
        )
    return [
        one
        for trace in chosen
        for one in seeded_workloads(
            trace=trace,
            fmt=fmt,
            member=member,
            seeds=seeds,
            cluster=cluster,
            duration_h=duration_h,
            load=load,
            skip_bad_rows=skip_bad_rows,
            options=options,
            start_h=start_h,
            end_h=end_h,
            profiles=profiles if is_pollux(trace) else None,
        )
    ]


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _trial_record(
    space: SearchSpace,
    trial: Trial,
    base: ElasticPolicy,
    seeded: list[Seeded],
    *,
    cluster: ClusterSpec,
) -> dict[str, object]:
    """A run as trials.json gives it: the base's run says ``base`` and gives its values, and
    each says the node order it ran with (its figures depend on it)."""
    values: dict[str, float | None] = dict(trial.params)
    if trial.is_base:
        values = {n: param_value(base, n) for n in space.parameters}
    # As the policy file writes them: durations as strings ("5m"), other values as numbers.
    params = {
        n: None if v is None else (param_text(n, v) if _is_duration(n) else v)
        for n, v in values.items()
    }
    record: dict[str, object] = {
        "trial": "base" if trial.is_base else trial.index,
        "params": params,
        "objective": _json_number(trial.objective),
        "spread": _json_number(_spread(trial)),
        "node_order": cluster.node_order.value,
        "by_workload": [
            {"workload": one.workload.name, "seed": one.seed, space.objective: _json_number(v)}
            for one, v in zip(seeded, trial.by_workload, strict=True)
        ],
    }
    if space.constraints:
        record["figures"] = {n: _json_number(v) for n, v in trial.figures.items()}
        record["meets_constraints"] = trial.meets
    return record


def _is_duration(name: str) -> bool:
    param = parameter(name)
    return param is not None and param.unit == "duration"


def _spread(trial: Trial) -> float:
    """The objective's range over the workloads (seeds) a trial ran on: how much of a
    difference between two trials the workloads alone make; NaN on one workload."""
    values = [v for v in trial.by_workload if math.isfinite(v)]
    return max(values) - min(values) if len(values) > 1 else math.nan


def _bound_text(low: float, high: float) -> str:
    if math.isinf(low):
        return f"<= {high:g}"
    return f">= {low:g}" if math.isinf(high) else f"{low:g} to {high:g}"


def _trials_table(space: SearchSpace, result: TuneResult, base_policy: ElasticPolicy) -> Table:
    """The best 15 trials, and the base policy's run among them where it ranks (at the end if
    below them): those that meet the constraints first, each group by objective."""
    trials = result.trials
    names = space.parameters
    bounded = [n for n in space.constraints if n != space.objective]
    done = (
        f"{len(trials)} of {result.planned} trials (interrupted)"
        if result.interrupted
        else f"{len(trials)} trials"
    )
    notes = ["best first; trial: its id in trials.csv and trials.json"]
    if any(n.startswith("defaults.") for n in names):
        notes.append("defaults.* parameters are shown without the prefix")
    if space.constraints:
        notes.append("–: misses a constraint")
    several = bool(result.trials) and len(result.trials[0].by_workload) > 1
    if several:
        notes.append("spread: highest minus lowest objective over the workloads")
    table = Table(
        title=f"tide tune: {done}, objective {space.objective} "
        f"({'higher' if space.maximise else 'lower'} is better)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        caption="; ".join(notes) or None,
    )
    # Headers break after their dots and underscores, so that every name is whole in an
    # 80-column terminal (an ellipsis would leave every "defaults." column unreadable).
    spread = ["spread"] if several else []
    for col in ("trial", *names, space.objective, *spread, *bounded):
        header = col.removeprefix("defaults.").replace(".", ".\n").replace("_", "_\n")
        widest = max(map(len, header.splitlines()))
        table.add_column(header, justify="right", overflow="fold", min_width=widest)

    def order(t: Trial) -> tuple[bool, float]:
        return (not t.meets, space.loss(t.objective))

    ranked = sorted(trials, key=order)[:15]
    if result.base is not None:
        base = result.base
        place = sum(order(t) < order(base) for t in ranked)
        ranked.insert(place, base)  # ahead of equal trials: a tie goes to the base
    for trial in ranked:
        # The trial's id, as trials.csv and trials.json give it: a rank of its own would
        # number the rows differently from the files.
        label = "base" if trial.is_base else str(trial.index)
        if trial.is_base:
            values = [param_value(base_policy, n) for n in names]
        else:
            values = [trial.params.get(n) for n in names]
        table.add_row(
            label if trial.meets else f"{label} –",
            *(param_text(n, v) for n, v in zip(names, values, strict=True)),
            format_number(trial.objective, 3),
            *([format_number(_spread(trial), 3)] if several else []),
            *(format_number(trial.figures[n], 3) for n in bounded),
        )
    return table


def _per_workload_table(
    space: SearchSpace, result: TuneResult, seeded: list[Seeded]
) -> Table | None:
    """The best trial against the base policy on each workload, when there are several (a mean
    can hide a workload the best policy makes worse); None when there is nothing to compare."""
    best, base = result.best_trial, result.base
    if best is None or base is None or best.is_base or len(seeded) < 2:
        return None
    table = Table(
        title=f"best trial against the base policy, {space.objective} per workload",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for col in ("workload", "seed", "base", "best", "change"):
        table.add_column(col, justify="left" if col == "workload" else "right")
    for one, before, after in zip(seeded, base.by_workload, best.by_workload, strict=True):
        change = (after / before - 1.0) * 100.0 if before else math.nan
        change = 0.0 if round(change, 1) == 0 else change  # no "-0.0%"
        worse = space.loss(after) > space.loss(before)
        table.add_row(
            one.workload.name,
            str(one.seed),
            format_number(before, 3),
            format_number(after, 3),
            f"[red]{change:+.1f}%[/red]" if worse else f"{change:+.1f}%",
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
            f"neither the base policy nor any finished trial meets the constraints "
            f"({bounds}){why}; no policy written; "
            f"trials: {trials_csv}"
        )
    best, base, objective = result.best_trial, result.base, space.objective
    written = out / "best-policy.yaml"
    if best.is_base:
        return (
            f"no trial beats the base policy ({objective} {best.objective:.4g}); "
            f"{written} is the base policy; trials: {trials_csv}"
        )
    label = "best policy of the finished trials" if result.interrupted else "best policy"
    if base is None:
        against = "the base policy's run did not finish"
    elif not base.meets:
        against = f"the base policy misses the constraints, at {base.objective:.4g}"
    else:
        change = (best.objective / base.objective - 1.0) * 100.0 if base.objective else math.nan
        against = f"the base policy {base.objective:.4g}, {change:+.1f}%"
    return f"{label}: {written} ({objective} {best.objective:.4g}; {against}); trials: {trials_csv}"


def register(app: typer.Typer) -> None:
    """Add ``tune`` to the ``tide`` app."""

    @app.command(name="tune")
    def tune_command(
        space_file: Annotated[
            Path, typer.Argument(help="Search space (YAML).", metavar="SPACE.yaml")
        ],
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
                help="Seeds, e.g. 0,1,2: every workload runs at each, with its measurement "
                "noise and faults; a seed also draws the built-in workload, and which jobs of a "
                "Philly or ITP trace are elastic.",
            ),
        ] = "0",
        fmt: FormatOpt = "auto",
        member: MemberOpt = "cluster04.csv",
        profiles: ProfilesOpt = None,
        cluster_file: ClusterOpt = None,
        node_order: NodeOrderOpt = None,
        policy_file: Annotated[
            Path | None,
            typer.Option(
                "--policy",
                help="Base policy whose parameters vary; default: simulate's default policy.",
            ),
        ] = None,
        workers: Annotated[
            int | None,
            typer.Option(
                "--workers",
                min=1,
                help="Trials run at once, each in its own process; default: one per CPU. The "
                "results do not depend on it.",
            ),
        ] = None,
        duration_h: DurationOpt = DEFAULT_DURATION_H,
        load: LoadOpt = DEFAULT_LOAD,
        start_h: StartOpt = 0.0,
        end_h: EndOpt = None,
        horizon_h: HorizonOpt = None,
        skip_bad_rows: SkipOpt = False,
        no_declared_work: NoDeclaredWorkOpt = False,
        no_adaptive_batch: NoAdaptiveBatchOpt = False,
        node_mtbf_h: MtbfOpt = None,
        outage_h: OutageOpt = None,
        quiet_s: QuietOpt = None,
        no_bound: NoBoundOpt = False,
        out: Annotated[
            Path,
            typer.Option(
                "--out",
                help="Folder for best-policy.yaml, trials.csv and trials.json.",
                callback=writable_folder,
            ),
        ] = Path("tide-tune-out"),
    ) -> None:
        """Search policy parameters; write the best policy and a table of trials."""
        try:
            chosen = seed_list(seeds)

            options = seed_options(  # the flags are checked before any file is read
                horizon_h=horizon_h,
                mtbf_h=node_mtbf_h,
                outage_h=outage_h,
                quiet_s=quiet_s,
                declared_work=not no_declared_work,
                adaptive_batch=not no_adaptive_batch,
            )
            space = load_search_space(space_file)
            cluster = with_node_order(
                load_cluster(cluster_file) if cluster_file else BUILTIN_CLUSTER, node_order
            )
            base = load_policy(policy_file) if policy_file else default_policy_for(cluster)
            warn_policy(base, cluster)
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
                start_h=start_h,
                end_h=end_h,
                profiles=profiles,
            )
            long_trace_tip([one.workload for one in seeded], quiet_s)
            if len(seeded) == 1:
                console.print(
                    "[yellow]warning:[/yellow] one workload at one seed: a difference between "
                    "trials below the run-to-run noise is not a finding; give --seeds 0,1,2 "
                    "(the table then shows each trial's spread across the seeds)"
                )
            planned = len(candidates(space))
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
                disable=not console.is_terminal,  # piped: no bar frozen halfway in the file
            ) as progress:
                # The base policy runs as well as every candidate.
                task = progress.add_task("tune", total=planned + 1)
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
                    workers=worker_count(workers, planned + 1),
                    on_trial=on_trial,
                    on_progress=on_progress,
                )
        except KeyboardInterrupt:
            console.print(f"interrupted; finished trials are in {out / 'trials.csv'}")
            raise typer.Exit(130) from None
        except (SimulationError, TideError) as e:
            print_error(e)
            raise typer.Exit(1) from e
        trials = result.trials
        if not trials:
            console.print("interrupted before any trial finished; no policy written")
            raise typer.Exit(130)
        best_file = out / "best-policy.yaml"
        if result.best_trial is None:
            best_file.unlink(missing_ok=True)  # a file from an earlier search is not this one's
        elif result.best_trial.is_base:
            best_file.write_text(policy_yaml(base))
        else:
            best_policy = dataclasses.replace(result.best, name=f"{base.name}-tuned")
            best_file.write_text(policy_yaml(best_policy))
        print_fitted(console, _trials_table(space, result, base))
        per_workload = _per_workload_table(space, result, seeded)
        if per_workload is not None:
            print_fitted(console, per_workload)
        console.print(_tune_outcome(space, result, out))
        console.print(
            f"simulated on {cluster.name} ({cluster.total_gpus} GPUs, "
            f"{cluster.node_order.value} placement: --node-order)"
        )
        if space.objective == "avg_jct_h" and no_bound:
            console.print(NO_BOUND)
        elif space.objective == "avg_jct_h":
            # How far the search could go at all: the comparison's lower bound, per workload.
            bounds = jct_lower_bounds_h([one.workload for one in seeded], cluster)
            console.print(
                f"no policy can bring avg_jct_h below {statistics.fmean(bounds):.4g} on these "
                f"workloads (the mean of their lower bounds: {BOUND_TERMS})"
            )
        runs = ([result.base] if result.base is not None else []) + trials
        (out / "trials.json").write_text(
            json.dumps([_trial_record(space, t, base, seeded, cluster=cluster) for t in runs])
        )
        if result.interrupted:
            raise typer.Exit(130)
        if result.best_trial is None:
            raise typer.Exit(1)
