"""``tide tune``: a thin command over ``simulations.tune``."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from scheduler_policy.errors import TideError
from scheduler_policy.policy_file import load_policy, policy_yaml
from simulations.api import Seeded, default_policy_for
from simulations.cluster_config import BUILTIN_CLUSTER, ClusterSpec, load_cluster
from simulations.compare import fmt as format_number
from simulations.compare import print_fitted
from simulations.errors import SimulationError
from simulations.run import RunOptions
from simulations.tune import (
    SearchSpace,
    TuneResult,
    candidates,
    check_values,
    distinct_sets,
    load_search_space,
    tune,
)
from simulations.workload import DEFAULT_LOAD
from tide.sim_options import (
    DEFAULT_DURATION_H,
    ClusterOpt,
    DurationOpt,
    FormatOpt,
    HorizonOpt,
    LoadOpt,
    MemberOpt,
    MtbfOpt,
    OutageOpt,
    QuietOpt,
    SkipOpt,
    console,
    long_trace_tip,
    run_options,
    seed_list,
    seeded_workloads,
    trace_seeds,
    warn_policy,
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
    (``trace_seeds``), or the built-in workload's draw for each seed. Each workload runs with
    its seed's measurement noise and faults, as ``tide simulate --seed`` runs it, so that a
    trial's figures are the ones a simulation of its policy shows.

    Raises:
        SimulationError: a trace given twice (however spelled), or one that cannot be read.
    """
    resolved = [t.resolve() for t in traces]
    for t, r in zip(traces, resolved, strict=True):
        if resolved.count(r) > 1:
            raise SimulationError(f"--trace: {t} is given twice")
    chosen: list[Path | None] = list(traces) or [None]  # None: the built-in workload
    return [
        one
        for trace in chosen
        for one in seeded_workloads(
            trace=trace,
            fmt=fmt,
            member=member,
            seeds=seeds if trace is None else trace_seeds(trace, fmt, seeds),
            cluster=cluster,
            duration_h=duration_h,
            load=load,
            skip_bad_rows=skip_bad_rows,
            options=options,
        )
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
    """Add ``tune`` to the ``tide`` app."""

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
            chosen = seed_list(seeds)

            def options(seed: int) -> RunOptions:
                return run_options(
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
            )
            long_trace_tip([one.workload for one in seeded], quiet_s)
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
