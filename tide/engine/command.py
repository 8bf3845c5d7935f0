"""``tide engine``: the deployed engine, a thin typer command over ``run_once`` and ``serve``.

``serve`` wires the parts together: the policy file (``PolicyWatcher``), the Prometheus
source, the Volcano client (``Link``), the Lease elector, the extender and the HTTP server, and
the loop (``EngineService``). It returns 0 after a clean stop (SIGTERM or SIGINT: the round
under way finishes or is abandoned, the Lease is released, the server and the watches stop).
``run_once`` runs one round. Both raise ``EngineFailure`` with the reason when they cannot
run; the command prints it and exits 1.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from prometheus_client.registry import CollectorRegistry

from metrics_collector.engine_metrics import EngineMetrics
from metrics_collector.prometheus import PrometheusConnection, PrometheusSource
from scheduler_policy.extender import Extender, ExtenderView
from scheduler_policy.policy.file import load_policy
from scheduler_policy.policy.spec import ElasticPolicy
from scheduler_policy.vocabulary.errors import TideError
from scheduler_policy.vocabulary.protocols import MetricsSource
from tide.engine.logs import json_logging
from tide.engine.options import (
    EngineFailure,
    EngineOptions,
    Link,
    default_identity,
    default_lease_namespace,
    parse_listen,
)
from tide.engine.service import Alone, EngineService, Round

# The Lease elector (kubernetes) and the HTTP server (aiohttp) are imported when the engine
# runs, not when ``tide`` starts: every other command would pay seconds for them.

logger = logging.getLogger(__name__)

SYNC_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


def connect_volcano(options: EngineOptions) -> Link:
    """The Volcano client on the kubeconfig (or the in-cluster service account).

    Raises:
        TideError: the configuration cannot be loaded.
    """
    from tide.engine.volcano_link import VolcanoLink

    return VolcanoLink(options)


def _load(options: EngineOptions) -> ElasticPolicy:
    try:
        return load_policy(options.policy_path)
    except TideError as e:
        raise EngineFailure(f"policy invalid: {e}") from e


MetricsFactory = Callable[[ElasticPolicy], MetricsSource]


def _metrics_factory(options: EngineOptions, given: MetricsFactory | None) -> MetricsFactory:
    if given is not None:
        return given
    if options.prometheus_url is None:
        raise EngineFailure(
            "no Prometheus to read throughput and queue use from: pass --prometheus URL "
            "(or set TIDE_PROMETHEUS_URL)"
        )
    try:
        connection = PrometheusConnection(url=options.prometheus_url)
    except ValueError as e:
        raise EngineFailure(f"--prometheus: {e}") from e

    def make(policy: ElasticPolicy) -> MetricsSource:
        # The cluster's free GPUs come from the Volcano client's nodes and pods (the API,
        # watched), so Prometheus is not asked for kube-state-metrics' figures.
        return PrometheusSource(
            connection=connection,
            settings=policy.metrics,
            interval_s=policy.interval_s,
            cluster_figures=False,
        )

    return make


def _connect(options: EngineOptions, connect: Callable[[EngineOptions], Link]) -> Link:
    try:
        link = connect(options)
    except TideError as e:
        raise EngineFailure(f"cannot connect to the cluster: {e}") from e
    try:
        link.sync(timeout_s=SYNC_TIMEOUT_S)
    except TideError as e:
        link.stop()
        raise EngineFailure(f"cluster unreachable: {e}") from e
    return link


def run_once(
    options: EngineOptions,
    *,
    connect: Callable[[EngineOptions], Link] = connect_volcano,
    metrics: MetricsFactory | None = None,
    registry: CollectorRegistry | None = None,
) -> Round:
    """One reconcile: observe, decide, log, and (unless a dry run) write as the leader.

    Args:
        options: what was asked for (``once`` is implied).
        connect: opens the connection to the API server.
        metrics: builds the metrics source for a policy; None: Prometheus at
            ``options.prometheus_url``.
        registry: where the engine's metrics go; a fresh one when None.

    Returns:
        The round.

    Raises:
        EngineFailure: the policy is invalid, the cluster or Prometheus unreachable, another
            engine holds the Lease, or a write failed; the message says which.
    """
    from scheduler_policy.adapters.leader import LeaseElector

    _load(options)
    make_metrics = _metrics_factory(options, metrics)
    link = _connect(options, connect)
    elector: LeaseElector | None = None
    try:
        if not options.dry_run:
            elector = LeaseElector(
                link.lease_api(namespace=options.lease_namespace, name=options.lease_name),
                identity=options.identity or default_identity(),
            )
            try:
                step = elector.try_once()
            except TideError as e:
                raise EngineFailure(f"cluster unreachable: the leader Lease: {e}") from e
            if not elector.is_leader():
                raise EngineFailure(
                    f"another engine leads (Lease {options.lease_namespace}/"
                    f"{options.lease_name}): {step.why}; use --dry-run to see its decisions"
                )
        service = EngineService(
            cluster=link.cluster, make_metrics=make_metrics, policy_path=options.policy_path,
            elector=elector, dry_run=options.dry_run,
            engine_metrics=EngineMetrics(registry or CollectorRegistry()),
        )  # fmt: skip
        try:
            outcome = service.run_round()
        except TideError as e:
            raise EngineFailure(f"cluster unreachable: {e}") from e
        finally:
            service.close()
        if outcome.report is not None and not outcome.report.reachable:
            first = outcome.report.problems[0] if outcome.report.problems else "no answer"
            raise EngineFailure(f"Prometheus unreachable at {options.prometheus_url}: {first}")
        if outcome.result.failed:
            listing = "; ".join(f"{change.job}: {why}" for change, why in outcome.result.failed)
            raise EngineFailure(f"{len(outcome.result.failed)} write(s) failed: {listing}")
        return outcome
    finally:
        if elector is not None:
            elector.release()
        link.stop()


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT set ``stop`` (main thread only); then restore."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, _frame: FrameType | None) -> None:
        logger.info("received %s: stopping", signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def serve(
    options: EngineOptions,
    *,
    connect: Callable[[EngineOptions], Link] = connect_volcano,
    metrics: MetricsFactory | None = None,
    stop: threading.Event | None = None,
    registry: CollectorRegistry | None = None,
    on_started: Callable[[EngineService, int], None] | None = None,
) -> int:
    """Run the engine until ``stop`` is set (SIGTERM or SIGINT set it).

    Args:
        options: what was asked for.
        connect: opens the connection to the API server.
        metrics: builds the metrics source for a policy; None: Prometheus at
            ``options.prometheus_url``.
        stop: ends the run when set; a new one when None.
        registry: where the engine's metrics go (served at ``/metrics``).
        on_started: called with the service and the HTTP port once everything runs.

    Returns:
        0 after a clean stop.

    Raises:
        EngineFailure: the engine could not start; the message says why.
    """
    stop = stop if stop is not None else threading.Event()
    # From the start: a SIGTERM while the watches sync still stops cleanly.
    with stop_on_signals(stop):
        return _serve(
            options, connect=connect, metrics=metrics, stop=stop, registry=registry,
            on_started=on_started,
        )  # fmt: skip


def _serve(
    options: EngineOptions,
    *,
    connect: Callable[[EngineOptions], Link],
    metrics: MetricsFactory | None,
    stop: threading.Event,
    registry: CollectorRegistry | None,
    on_started: Callable[[EngineService, int], None] | None,
) -> int:
    from scheduler_policy.adapters.leader import LeaseElector
    from tide.engine.http import EngineHttp

    policy = _load(options)
    make_metrics = _metrics_factory(options, metrics)
    registry = registry if registry is not None else CollectorRegistry()
    engine_metrics = EngineMetrics(registry)
    extender = Extender(stale_after_s=3 * policy.interval_s)
    link = _connect(options, connect)
    if stop.is_set():  # stopped while connecting
        link.stop()
        return 0
    service: EngineService | None = None

    def leadership(leader: bool) -> None:
        engine_metrics.record_leader(leader)
        if leader and service is not None:
            service.trigger("this engine became the leader")

    elector = None
    if not options.dry_run:
        elector = LeaseElector(
            link.lease_api(namespace=options.lease_namespace, name=options.lease_name),
            identity=options.identity or default_identity(),
            lease_duration_s=options.lease_duration_s,
            renew_every_s=options.renew_every_s,
            on_change=leadership,
        )

    def after_round(outcome: Round) -> None:
        extender.stale_after_s = 3 * outcome.policy.interval_s
        plan, observation = outcome.result.plan, outcome.result.observation
        if plan is not None:
            view = ExtenderView.from_plan(
                plan, observation, leader=outcome.wrote, now_s=observation.time_s
            )
            extender.update(view)

    service = EngineService(
        cluster=link.cluster, make_metrics=make_metrics, policy_path=options.policy_path,
        elector=elector if elector is not None else Alone(), dry_run=options.dry_run,
        engine_metrics=engine_metrics, on_round=after_round,
    )  # fmt: skip
    running = service

    def withheld(count: int) -> None:  # the extender withheld pods: reconcile at once
        running.notice(withheld_pods=count)

    http = EngineHttp(
        alive=service.alive, ready=service.ready, registry=registry, extender=extender,
        on_withheld=withheld,
    )  # fmt: skip
    try:
        port = http.start(options.host, options.port)
    except OSError as e:
        link.stop()
        raise EngineFailure(f"--listen {options.host}:{options.port}: {e}") from e
    link.on_change(lambda why: running.trigger(why))
    try:
        if elector is not None:
            elector.start()
        service.start()
        role = "dry run" if elector is None else f"identity {elector.identity}"
        logger.info(
            "tide engine running: policy %s, HTTP on %s:%d, %s",
            options.policy_path, options.host, port, role,
        )  # fmt: skip
        if on_started is not None:
            on_started(service, port)
        stop.wait()
    finally:  # a clean stop, or whatever went wrong above: each part stops, in order
        service.stop(timeout_s=STOP_TIMEOUT_S)
        if elector is not None:
            elector.stop(release=True)
        http.stop()
        link.stop()
        service.close()
    logger.info("tide engine stopped")
    return 0


def engine(
    policy: Annotated[
        Path,
        typer.Option(
            "--policy", "-p", metavar="FILE", help="ElasticPolicy file; re-read when it changes."
        ),
    ],
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig",
            metavar="FILE",
            help="kubeconfig file. Default: the pod's service account.",
            show_default=False,
        ),
    ] = None,
    prometheus: Annotated[
        str | None,
        typer.Option(
            "--prometheus",
            metavar="URL",
            envvar="TIDE_PROMETHEUS_URL",
            show_default=False,
            help="Prometheus URL, e.g. http://prometheus.monitoring:9090.",
        ),
    ] = None,
    listen: Annotated[
        str,
        typer.Option(
            "--listen",
            metavar="HOST:PORT",
            help="HOST:PORT of /healthz, /readyz, /metrics, /extender.",
        ),
    ] = "0.0.0.0:8080",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Decide and log every decision; never write.")
    ] = False,
    once: Annotated[
        bool, typer.Option("--once", help="Reconcile once, then exit (non-zero on failure).")
    ] = False,
    lease_namespace: Annotated[
        str | None,
        typer.Option(
            "--lease-namespace",
            metavar="NS",
            show_default=False,
            help="Namespace of the leader Lease. Default: the pod's namespace, or default.",
        ),
    ] = None,
    lease_name: Annotated[
        str, typer.Option("--lease-name", metavar="NAME", help="Name of the leader Lease.")
    ] = "tide-engine",
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace",
            metavar="NS",
            show_default=False,
            help="Manage the Volcano Jobs of this namespace only. Default: all namespaces.",
        ),
    ] = None,
) -> None:
    """Run the engine: reconcile at the policy's interval, as the leader of its replicas."""
    try:
        host, port = parse_listen(listen)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    options = EngineOptions(
        policy_path=policy, kubeconfig=kubeconfig, prometheus_url=prometheus, host=host,
        port=port, dry_run=dry_run, once=once, namespace=namespace,
        lease_namespace=lease_namespace or default_lease_namespace(), lease_name=lease_name,
        identity=os.environ.get("TIDE_ENGINE_IDENTITY") or default_identity(),
    )  # fmt: skip
    try:
        with json_logging():
            if once:
                run_once(options)
            else:
                serve(options)
    except EngineFailure as e:
        typer.echo(f"tide engine: {e}", err=True)
        raise typer.Exit(1) from e


def register(app: typer.Typer) -> None:
    """Add ``tide engine`` to the ``tide`` command."""
    app.command("engine")(engine)
