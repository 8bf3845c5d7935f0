"""A real Prometheus server on loopback for tests, with history backfilled by promtool.

Debian's ``/usr/bin/prometheus`` runs on a free 127.0.0.1 port with a temporary TSDB and a
generated configuration that scrapes only the loopback targets a test names. History goes in
before the start with ``promtool tsdb create-blocks-from openmetrics``; fresh data comes from
scraping a live exporter the test starts (see ``PrometheusServer.wait_for_series``).

What promtool 2.42 does with recent samples (measured, see ``tests/metrics_collector/
test_prometheus_server.py``): it cuts the input into blocks aligned to 2 h and writes every one,
the newest included, so a backfilled sample a few seconds old is queryable as soon as the server
is ready; the server loads those blocks beside its head block (overlapping blocks are allowed by
default since 2.39). A backfilled series has no staleness marker: an instant query still returns
its newest sample for the lookback delta (5 min), whatever its age.

Typical use::

    server = PrometheusServer(tmp_path, scrape_targets=["127.0.0.1:9100"], scrape_interval_s=1)
    backfill(server.tsdb_dir, [Series("up_gpus", {"queue_name": "q"}, [(t0, 1.0), (t1, 2.0)])])
    server.start()
    try:
        ...  # query server.url
    finally:
        server.stop()
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

PROMETHEUS = "prometheus"
PROMTOOL = "promtool"

MetricType = Literal["gauge", "counter", "unknown"]


class PrometheusUnavailable(RuntimeError):
    """The prometheus or promtool binary is not on this machine."""


def find_binaries() -> tuple[str, str]:
    """The paths of ``prometheus`` and ``promtool``.

    Returns:
        (prometheus, promtool).

    Raises:
        PrometheusUnavailable: either is missing from PATH (and from /usr/bin).
    """
    found: list[str] = []
    for name in (PROMETHEUS, PROMTOOL):
        path = shutil.which(name) or shutil.which(name, path="/usr/bin")
        if path is None:
            raise PrometheusUnavailable(
                f"{name} is not installed (Debian: apt-get install prometheus)"
            )
        found.append(path)
    return found[0], found[1]


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class Series:
    """One time series to backfill.

    Attributes:
        name: the sample name as PromQL sees it; a counter's ends in ``_total``.
        labels: its labels (not ``__name__``).
        samples: (time_s, value) pairs, seconds since the epoch; any order, sorted on write.
            NaN is written as OpenMetrics ``NaN``.
        type: the OpenMetrics family type (``counter`` needs the ``_total`` suffix).
    """

    name: str
    labels: Mapping[str, str]
    samples: Sequence[tuple[float, float]]
    type: MetricType = "gauge"

    @property
    def family(self) -> str:
        """The metric family's name: a counter's is its sample name without ``_total``."""
        if self.type == "counter":
            if not self.name.endswith("_total"):
                raise ValueError(f"counter series {self.name!r}: name must end in _total")
            return self.name.removesuffix("_total")
        return self.name


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def openmetrics_text(series: Sequence[Series]) -> str:
    """OpenMetrics exposition of ``series`` with timestamps in seconds, ending in ``# EOF``.

    Series of one family are written together under one ``# TYPE`` line, as the format asks.

    Raises:
        ValueError: two series of one family disagree on its type, or a counter's name lacks
            ``_total``.
    """
    families: dict[str, list[Series]] = {}
    for s in series:
        families.setdefault(s.family, []).append(s)
    lines: list[str] = []
    for family, members in families.items():
        types = {m.type for m in members}
        if len(types) > 1:
            raise ValueError(f"family {family!r}: series disagree on its type {sorted(types)}")
        lines.append(f"# TYPE {family} {members[0].type}")
        # Series given twice (e.g. a pod's counter before and after a restart) are merged, so
        # each series' samples go out once, in time order.
        merged: dict[str, list[tuple[float, float]]] = {}
        for m in members:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(m.labels.items()))
            merged.setdefault(f"{m.name}{{{labels}}}" if labels else m.name, []).extend(m.samples)
        for head, samples in merged.items():
            for t_s, value in sorted(samples, key=lambda sample: sample[0]):
                lines.append(f"{head} {_number(value)} {t_s:.3f}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def backfill(tsdb_dir: Path, series: Sequence[Series], *, promtool: str | None = None) -> None:
    """Write ``series`` as TSDB blocks into ``tsdb_dir`` (before the server starts).

    Args:
        tsdb_dir: the server's storage folder (``PrometheusServer.tsdb_dir``); created if absent.
        series: what to write; an empty list writes nothing.
        promtool: the promtool binary; found on PATH when None.

    Raises:
        PrometheusUnavailable: promtool is missing.
        RuntimeError: promtool refused the input; the message carries its output.
    """
    if not series:
        return
    tool = promtool or find_binaries()[1]
    tsdb_dir.mkdir(parents=True, exist_ok=True)
    source = tsdb_dir.parent / f"backfill-{time.monotonic_ns()}.om"
    source.write_text(openmetrics_text(series))
    try:
        done = subprocess.run(
            [tool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(tsdb_dir)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        source.unlink(missing_ok=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"promtool backfill into {tsdb_dir} failed ({done.returncode}):\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )


@dataclass
class PrometheusServer:
    """One Prometheus process on 127.0.0.1, its own process group, its own TSDB.

    Attributes:
        tmp_path: a folder the server owns (its TSDB, configuration and log go under it).
        scrape_targets: ``host:port`` targets on loopback, scraped at ``/metrics``.
        scrape_interval_s: how often it scrapes them (and evaluates nothing else).
        port: the port it listens on; a free one when 0.
        ready_timeout_s: how long ``start`` waits for ``/-/ready``.
        extra_args: further command-line flags.
    """

    tmp_path: Path
    scrape_targets: Sequence[str] = ()
    scrape_interval_s: float = 1.0
    port: int = 0
    ready_timeout_s: float = 30.0
    extra_args: Sequence[str] = ()
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.port == 0:
            self.port = free_port()
        self.tmp_path.mkdir(parents=True, exist_ok=True)
        self.tsdb_dir.mkdir(parents=True, exist_ok=True)

    @property
    def tsdb_dir(self) -> Path:
        """The storage folder: backfill into it before ``start``."""
        return self.tmp_path / "tsdb"

    @property
    def config_path(self) -> Path:
        return self.tmp_path / "prometheus.yml"

    @property
    def log_path(self) -> Path:
        return self.tmp_path / "prometheus.log"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, without a trailing slash."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def config_text(self) -> str:
        """The generated configuration: global intervals and one static job for the targets."""
        # Prometheus durations take whole units only ("500ms", not "0.5s").
        interval = f"{max(round(self.scrape_interval_s * 1000), 1)}ms"
        config: dict[str, Any] = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [],
        }
        if self.scrape_targets:
            config["scrape_configs"].append(
                {
                    "job_name": "test",
                    "scrape_interval": interval,
                    "scrape_timeout": interval,
                    # Keep the exporter's own job/instance labels (e.g. a worker's namespace).
                    "honor_labels": True,
                    "static_configs": [{"targets": list(self.scrape_targets)}],
                }
            )
        # JSON is YAML: no YAML writer needed here.
        return json.dumps(config, indent=2)

    def start(self) -> PrometheusServer:
        """Start the server and wait (bounded) until ``/-/ready`` answers 200.

        Returns:
            self.

        Raises:
            PrometheusUnavailable: the binary is missing.
            RuntimeError: it exited or did not become ready in ``ready_timeout_s``; the
                server is stopped and the message carries the end of its log.
        """
        if self.running:
            return self
        binary = find_binaries()[0]
        self.config_path.write_text(self.config_text())
        cmd = [
            binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.tsdb_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            # Backfilled history may be old: keep it all.
            "--storage.tsdb.retention.time=3650d",
            "--web.enable-lifecycle",
            "--log.level=warn",
            *self.extra_args,
        ]
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child holds it
        try:
            self._proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self.stop()
                raise RuntimeError(
                    f"prometheus exited with {self._proc.returncode}:\n{self.log_tail()}"
                )
            if self._ready():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(
            f"prometheus not ready after {self.ready_timeout_s} s:\n{self.log_tail()}"
        )

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as reply:
                return bool(reply.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, *, timeout_s: float = 10.0) -> None:
        """Stop the server's whole process group: SIGTERM, then SIGKILL after ``timeout_s``.

        Safe to call twice, or on a server that never started.
        """
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    def query(self, promql: str, *, time_s: float | None = None) -> list[dict[str, Any]]:
        """The ``result`` list of an instant query (``/api/v1/query``).

        Raises:
            RuntimeError: the server answered an error.
        """
        params = {"query": promql}
        if time_s is not None:
            params["time"] = f"{time_s:.3f}"
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = json.loads(reply.read())
        if body.get("status") != "success":
            raise RuntimeError(f"query {promql!r} failed: {body}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_for_series(
        self, promql: str, *, count: int = 1, timeout_s: float = 30.0
    ) -> list[dict[str, Any]]:
        """Poll an instant query until it returns at least ``count`` series (bounded).

        Args:
            promql: the query, e.g. ``tide_worker_world_size{volcano_job="bert"}``.
            count: how many series must be present.
            timeout_s: how long to wait.

        Returns:
            The query's result once it has ``count`` series.

        Raises:
            TimeoutError: it never did; the message names the query and what came back.
        """
        deadline = time.monotonic() + timeout_s
        last: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            with contextlib.suppress(urllib.error.URLError, OSError):
                last = self.query(promql)
                if len(last) >= count:
                    return last
            time.sleep(0.1)
        raise TimeoutError(
            f"{promql!r}: {len(last)} series after {timeout_s} s, wanted {count}: {last[:3]}"
        )

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def require_binaries() -> tuple[str, str]:
    """``find_binaries()``, or skip the test when they are missing, except under CI.

    ``make test`` installs Prometheus, so under CI (``CI=true``) a missing binary fails the test
    instead of skipping it.
    """
    import pytest  # only the fixtures need pytest; the helpers above are plain Python

    try:
        return find_binaries()
    except PrometheusUnavailable as e:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI: {e}")
        pytest.skip(str(e))


class Exporter:
    """A ``prometheus_client`` registry served on a free 127.0.0.1 port, for a server to scrape.

    Args:
        registry: what to serve (a ``CollectorRegistry``).

    ``target`` is the ``host:port`` to pass as a scrape target; ``close`` frees the port.
    """

    def __init__(self, registry: Any) -> None:
        from prometheus_client import start_http_server

        self.port = free_port()
        self._server, self._thread = start_http_server(
            self.port, addr="127.0.0.1", registry=registry
        )

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PrometheusFactory:
    """Starts servers for one test and stops every one of them at teardown.

    ``start(series=..., scrape_targets=...)`` backfills, starts and returns a server; use it
    through the ``prometheus_factory`` fixture, whose finalizer calls ``stop_all`` whether the
    test passed or failed.
    """

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.servers: list[PrometheusServer] = []

    def create(
        self,
        *,
        series: Sequence[Series] = (),
        scrape_targets: Sequence[str] = (),
        scrape_interval_s: float = 1.0,
        extra_args: Sequence[str] = (),
    ) -> PrometheusServer:
        """A server with ``series`` backfilled, not started yet (stopped at teardown)."""
        _, promtool = require_binaries()
        server = PrometheusServer(
            self.tmp_path / f"prometheus-{len(self.servers)}",
            scrape_targets=scrape_targets,
            scrape_interval_s=scrape_interval_s,
            extra_args=extra_args,
        )
        self.servers.append(server)
        backfill(server.tsdb_dir, series, promtool=promtool)
        return server

    def start(
        self,
        *,
        series: Sequence[Series] = (),
        scrape_targets: Sequence[str] = (),
        scrape_interval_s: float = 1.0,
        extra_args: Sequence[str] = (),
    ) -> PrometheusServer:
        """A started server with ``series`` backfilled (stopped at teardown)."""
        return self.create(
            series=series,
            scrape_targets=scrape_targets,
            scrape_interval_s=scrape_interval_s,
            extra_args=extra_args,
        ).start()

    def stop_all(self) -> None:
        for server in self.servers:
            server.stop()
