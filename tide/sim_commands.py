"""``tide simulate`` and ``tide compare``: thin commands over ``simulations``."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from scheduler_policy.policy.file import load_policy
from scheduler_policy.vocabulary.errors import TideError
from simulations.api import PolicyRun, Seeded, default_policy_for, with_node_order
from simulations.cluster_config import BUILTIN_CLUSTER, ClusterSpec, load_cluster
from simulations.controllers import BASELINE_NAMES
from simulations.errors import SimulationError
from simulations.run import RunOptions
from simulations.workload import DEFAULT_LOAD
from tide.comparison import run_comparison
from tide.sim_options import (
    DEFAULT_DURATION_H,
    ClusterOpt,
    DurationOpt,
    EndOpt,
    FormatOpt,
    HorizonOpt,
    JsonOpt,
    LoadOpt,
    MemberOpt,
    MtbfOpt,
    NoAdaptiveBatchOpt,
    NoBoundOpt,
    NoDeclaredWorkOpt,
    NodeOrderOpt,
    OutageOpt,
    OutOpt,
    ProfilesOpt,
    QuietOpt,
    SeedOpt,
    SeedsOpt,
    SimWorkersOpt,
    SkipOpt,
    StartOpt,
    TraceOpt,
    chosen_seeds,
    console,
    long_trace_tip,
    print_error,
    seed_options,
    seeded_workloads,
    warn_policy,
    worker_count,
)


def _seeded_setup(
    *,
    trace: Path | None,
    fmt: str,
    member: str,
    cluster_file: Path | None,
    node_order: str | None,
    seeds: list[int],
    duration_h: float,
    load: float,
    skip_bad_rows: bool,
    options: Callable[[int], RunOptions],
    start_h: float = 0.0,
    end_h: float | None = None,
    profiles: Path | None = None,
) -> tuple[list[Seeded], ClusterSpec]:
    """The cluster (with ``--node-order``), and each seed's workload and run options
    (``seed_options``)."""
    cluster = with_node_order(
        load_cluster(cluster_file) if cluster_file else BUILTIN_CLUSTER, node_order
    )
    seeded = seeded_workloads(
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
        profiles=profiles,
    )
    return seeded, cluster


POLICY_NAMES = ("tide", *BASELINE_NAMES)


def policy_names(text: str) -> list[str]:
    """``--policies`` as a list of names: comma-separated, at least one, each known, none twice.

    Args:
        text: the option's value.

    Returns:
        The names, in the order given.

    Raises:
        SimulationError: an empty list, an unknown name (with the nearest known one) or a name
            given twice.
    """
    known = ", ".join(POLICY_NAMES)
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise SimulationError(f"--policies: no policy given; name one or more of {known}")
    for i, name in enumerate(names):
        if name not in POLICY_NAMES:
            close = difflib.get_close_matches(name, POLICY_NAMES, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise SimulationError(f"--policies: unknown policy {name!r}; {hint}known: {known}")
        if name in names[:i]:
            raise SimulationError(f"--policies: {name} is given twice")
    return names


def register(app: typer.Typer) -> None:
    """Add ``simulate`` and ``compare`` to the ``tide`` app."""

    @app.command()
    def simulate(
        trace: TraceOpt = None,
        fmt: FormatOpt = "auto",
        member: MemberOpt = "cluster04.csv",
        profiles: ProfilesOpt = None,
        cluster_file: ClusterOpt = None,
        node_order: NodeOrderOpt = None,
        policy_file: Annotated[
            Path | None,
            typer.Option(
                "--policy",
                help="tide policy file; default: every setting at its built-in default, each "
                "elastic queue of the cluster scaled and borrowing idle GPUs (on the built-in "
                "cluster: manifests/policies/default.yaml).",
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
        start_h: StartOpt = 0.0,
        end_h: EndOpt = None,
        horizon_h: HorizonOpt = None,
        skip_bad_rows: SkipOpt = False,
        no_declared_work: NoDeclaredWorkOpt = False,
        no_adaptive_batch: NoAdaptiveBatchOpt = False,
        node_mtbf_h: MtbfOpt = None,
        outage_h: OutageOpt = None,
        quiet_s: QuietOpt = None,
        workers: SimWorkersOpt = None,
        no_bound: NoBoundOpt = False,
        out: OutOpt = Path("tide-sim-out"),
        json_path: JsonOpt = None,
    ) -> None:
        """Replay a workload through tide's engine and the baselines; compare them."""
        chosen = chosen_seeds(seed, seeds)
        try:
            names = policy_names(policies)  # before any file is read
            seeded, cluster = _seeded_setup(
                trace=trace,
                fmt=fmt,
                member=member,
                cluster_file=cluster_file,
                node_order=node_order,
                seeds=chosen,
                duration_h=duration_h,
                load=load,
                skip_bad_rows=skip_bad_rows,
                start_h=start_h,
                end_h=end_h,
                profiles=profiles,
                options=seed_options(
                    horizon_h=horizon_h,
                    mtbf_h=node_mtbf_h,
                    outage_h=outage_h,
                    quiet_s=quiet_s,
                    declared_work=not no_declared_work,
                    adaptive_batch=not no_adaptive_batch,
                ),
            )
            policy = load_policy(policy_file) if policy_file else default_policy_for(cluster)
            warn_policy(policy, cluster)
            runs = [PolicyRun(name, name, policy if name == "tide" else None) for name in names]
            long_trace_tip([seeded[0].workload], quiet_s)
            run_comparison(
                console=console,
                runs=runs,
                seeded=seeded,
                cluster=cluster,
                out_dir=out,
                json_path=json_path,
                workers=worker_count(workers, len(runs) * len(seeded)),
                with_bound=not no_bound,
            )
        except (SimulationError, TideError) as e:
            print_error(e)
            raise typer.Exit(1) from e

    @app.command()
    def compare(
        policy_files: Annotated[list[Path], typer.Argument(help="tide policy files to compare.")],
        trace: TraceOpt = None,
        fmt: FormatOpt = "auto",
        member: MemberOpt = "cluster04.csv",
        profiles: ProfilesOpt = None,
        cluster_file: ClusterOpt = None,
        node_order: NodeOrderOpt = None,
        seed: SeedOpt = 0,
        seeds: SeedsOpt = None,
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
        workers: SimWorkersOpt = None,
        no_bound: NoBoundOpt = False,
        out: OutOpt = Path("tide-compare-out"),
        json_path: JsonOpt = None,
    ) -> None:
        """Run several tide policy files side by side on the same workload."""
        chosen = chosen_seeds(seed, seeds)
        try:
            seeded, cluster = _seeded_setup(
                trace=trace,
                fmt=fmt,
                member=member,
                cluster_file=cluster_file,
                node_order=node_order,
                seeds=chosen,
                duration_h=duration_h,
                load=load,
                skip_bad_rows=skip_bad_rows,
                start_h=start_h,
                end_h=end_h,
                profiles=profiles,
                options=seed_options(
                    horizon_h=horizon_h,
                    mtbf_h=node_mtbf_h,
                    outage_h=outage_h,
                    quiet_s=quiet_s,
                    declared_work=not no_declared_work,
                    adaptive_batch=not no_adaptive_batch,
                ),
            )
            runs: list[PolicyRun] = []
            stems = [path.stem for path in policy_files]
            for path in policy_files:
                policy = load_policy(path)
                warn_policy(policy, cluster)
                # Two files of one name (in different folders) are told apart by their paths.
                label = path.stem if stems.count(path.stem) == 1 else str(path)
                if any(run.label == label for run in runs):
                    raise SimulationError(f"{path}: given twice")
                runs.append(PolicyRun(label, "tide", policy))
            long_trace_tip([seeded[0].workload], quiet_s)
            run_comparison(
                console=console,
                runs=runs,
                seeded=seeded,
                cluster=cluster,
                out_dir=out,
                json_path=json_path,
                workers=worker_count(workers, len(runs) * len(seeded)),
                with_bound=not no_bound,
            )
        except (SimulationError, TideError) as e:
            print_error(e)
            raise typer.Exit(1) from e
