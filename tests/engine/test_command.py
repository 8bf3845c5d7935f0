"""``tide engine``: exit codes and messages through CliRunner, ``run_once`` and ``serve`` on a fake
link (FakeCluster and an in-memory Lease), the HTTP server, and the signal handler."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from prometheus_client.registry import CollectorRegistry
from typer.testing import CliRunner

from scheduler_policy.policy.file import policy_yaml
from scheduler_policy.testing.fake import FakeCluster
from scheduler_policy.vocabulary.errors import TemporaryError
from scheduler_policy.vocabulary.protocols import ClusterClient
from scheduler_policy.vocabulary.state import JobKey
from tests.engine.test_service import WAIT_S, policy, wait_for, write_policy
from tests.scheduler_policy.builders import make_job, make_observation
from tests.scheduler_policy.test_leader import MemoryLeases
from tide.cli import app
from tide.engine.command import run_once, serve, stop_on_signals
from tide.engine.logs import json_logging
from tide.engine.options import EngineFailure, EngineOptions, parse_listen
from tide.engine.service import EngineService

runner = CliRunner()


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeLink:
    """A FakeCluster and one in-memory Lease, as ``Link``."""

    def __init__(self, cluster: FakeCluster, *, unreachable: bool = False) -> None:
        self.fake = cluster
        self.leases = MemoryLeases()
        self.unreachable = unreachable
        self.callbacks: list[Callable[[str], None]] = []
        self.stopped = False

    @property
    def cluster(self) -> ClusterClient:
        return self.fake

    def lease_api(self, *, namespace: str, name: str) -> MemoryLeases:
        self.leases.namespace, self.leases.name = namespace, name
        return self.leases

    def sync(self, *, timeout_s: float) -> None:
        if self.unreachable:
            raise TemporaryError("connection refused by 127.0.0.1:1")

    def on_change(self, callback: Callable[[str], None]) -> None:
        self.callbacks.append(callback)

    def stop(self) -> None:
        self.stopped = True


def cluster() -> FakeCluster:
    return FakeCluster(make_observation(make_job("a", current=2), free=4))


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    return write_policy(tmp_path / "policy.yaml", policy(interval_s=3600.0))


def options(path: Path, **changes: object) -> EngineOptions:
    base = EngineOptions(policy_path=path, prometheus_url="http://127.0.0.1:1", identity="me",
                         host="127.0.0.1", port=0)  # fmt: skip
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


# -- the command line ---------------------------------------------------------------------------


def unreachable_kubeconfig(folder: Path) -> Path:
    """A kubeconfig whose API server is a closed port on 127.0.0.1."""
    path = folder / "unreachable.kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {"apiVersion": "v1", "kind": "Config", "current-context": "x",
             "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{closed_port()}",
                                                    "insecure-skip-tls-verify": True}}],
             "users": [{"name": "u", "user": {"token": "t"}}],
             "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}
        )
    )  # fmt: skip
    return path


def prometheus_closed() -> list[str]:
    return ["--prometheus", f"http://127.0.0.1:{closed_port()}"]


CLI_FAILURES = [
    ("a missing policy file", lambda p: ["--policy", str(p.parent / "absent.yaml")], 1,
     ["tide engine: policy invalid", "absent.yaml"]),
    ("an invalid policy file", lambda p: ["--policy", str(p.with_name("bad.yaml"))], 1,
     ["tide engine: policy invalid", "bad.yaml", "intervall"]),
    ("no Prometheus", lambda p: ["--policy", str(p)], 1, ["pass --prometheus URL"]),
    ("a bad Prometheus URL", lambda p: ["--policy", str(p), "--prometheus", "prometheus:9090"], 1,
     ["--prometheus", "http://"]),
    ("a bad --listen", lambda p: ["--policy", str(p), "--listen", "8080"], 2, ["HOST:PORT"]),
    ("an unreachable API server",
     lambda p: ["--policy", str(p), "--kubeconfig", str(unreachable_kubeconfig(p.parent)),
                *prometheus_closed()], 1,
     ["tide engine: cluster unreachable", "Connection refused"]),
    ("a missing kubeconfig",
     lambda p: ["--policy", str(p), "--kubeconfig", str(p.parent / "none"), *prometheus_closed()],
     1, ["tide engine: cannot connect to the cluster", "none"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "code", "said"), [c[1:] for c in CLI_FAILURES], ids=[c[0] for c in CLI_FAILURES]
)
def test_the_command_refuses_with_the_reason(
    policy_file: Path,
    args: Callable[[Path], list[str]],
    code: int,
    said: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TIDE_PROMETHEUS_URL", raising=False)
    policy_file.with_name("bad.yaml").write_text(
        policy_yaml(policy()).replace("interval:", "intervall:")
    )
    result = runner.invoke(app, ["engine", "--once", "--dry-run", *args(policy_file)])
    assert result.exit_code == code, result.output
    text = " ".join(result.output.split())
    for words in said:
        assert words in text


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0.0.0.0:8080", ("0.0.0.0", 8080)), ("127.0.0.1:0", ("127.0.0.1", 0)),
     ("[::1]:9090", ("::1", 9090)), ("localhost:65535", ("localhost", 65535))],
    ids=["any address", "any port", "IPv6", "a name"],
)  # fmt: skip
def test_parse_listen(value: str, expected: tuple[str, int]) -> None:
    assert parse_listen(value) == expected


@pytest.mark.parametrize("value", ["8080", ":8080", "host:", "host:http", "host:70000"])
def test_parse_listen_refuses(value: str) -> None:
    with pytest.raises(ValueError, match="--listen: must be HOST:PORT"):
        parse_listen(value)


# -- one round --------------------------------------------------------------------------------


def test_once_dry_run_decides_and_writes_nothing(policy_file: Path) -> None:
    link = FakeLink(cluster())
    outcome = run_once(options(policy_file, dry_run=True, once=True), connect=lambda _o: link,
                       metrics=lambda _p: link.fake)  # fmt: skip
    assert link.fake.writes == [] and [c.job for c in outcome.would_write] == [JobKey("ns/a")]
    assert link.leases.lease is None  # a dry run takes no Lease
    assert link.stopped


def test_once_takes_the_lease_writes_and_releases_it(policy_file: Path) -> None:
    link = FakeLink(cluster())
    registry = CollectorRegistry()
    outcome = run_once(options(policy_file, once=True), connect=lambda _o: link,
                       metrics=lambda _p: link.fake, registry=registry)  # fmt: skip
    assert outcome.wrote and [c.job for c in link.fake.writes] == [JobKey("ns/a")]
    assert link.leases.read() is not None and not link.leases.read().held  # type: ignore[union-attr]
    assert registry.get_sample_value("tide_replica_writes_total", {"outcome": "applied"}) == 1


def _held_by_another(link: FakeLink) -> None:
    link.leases.create(
        {"metadata": {"name": "tide-engine", "namespace": "default"},
         "spec": {"holderIdentity": "the-deployed-engine", "leaseDurationSeconds": 15}}
    )  # fmt: skip


ONCE_FAILURES: list[tuple[str, Callable[[FakeLink], None], dict[str, object], str]] = [
    ("the cluster is unreachable", lambda link: setattr(link, "unreachable", True), {},
     "cluster unreachable: connection refused"),
    ("another engine holds the Lease", _held_by_another, {},
     "another engine leads (Lease default/tide-engine): the-deployed-engine holds the Lease"),
    ("a write is refused", lambda link: link.fake._refuse.add(JobKey("ns/a")), {},
     "1 write(s) failed: ns/a: job ns/a: refused by admission webhook"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("arrange", "changes", "said"),
    [f[1:] for f in ONCE_FAILURES],
    ids=[f[0] for f in ONCE_FAILURES],
)
def test_once_fails_with_the_reason(
    policy_file: Path, arrange: Callable[[FakeLink], None], changes: dict[str, object], said: str
) -> None:
    link = FakeLink(cluster())
    arrange(link)
    with pytest.raises(EngineFailure) as failure:
        run_once(options(policy_file, once=True, **changes), connect=lambda _o: link,
                 metrics=lambda _p: link.fake)  # fmt: skip
    assert said in str(failure.value)


def test_once_fails_when_prometheus_is_unreachable(policy_file: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    link = FakeLink(cluster())
    with pytest.raises(EngineFailure, match=f"Prometheus unreachable at {url}"):
        run_once(options(policy_file, once=True, dry_run=True, prometheus_url=url),
                 connect=lambda _o: link)  # fmt: skip
    assert link.fake.writes == []


# -- the long run -------------------------------------------------------------------------------


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_serve_leads_serves_its_probes_and_stops_cleanly(policy_file: Path) -> None:
    link = FakeLink(cluster())
    stop = threading.Event()
    started: list[tuple[EngineService, int]] = []
    codes: list[int] = []
    run = threading.Thread(
        target=lambda: codes.append(
            serve(options(policy_file), connect=lambda _o: link, metrics=lambda _p: link.fake,
                  stop=stop, on_started=lambda s, p: started.append((s, p)))
        )
    )  # fmt: skip
    run.start()
    try:
        wait_for(lambda: bool(started), "the engine to start")
        service, port = started[0]
        wait_for(lambda: get(port, "/readyz")[0] == 200, "readiness")
        assert get(port, "/healthz") == (200, "ok\n")
        wait_for(lambda: "tide_leader 1.0" in get(port, "/metrics")[1], "leadership")
        assert [c.job for c in link.fake.writes] == [JobKey("ns/a")]
        assert link.callbacks  # a pending gang reported by the client reconciles at once
        rounds = service.rounds
        link.callbacks[0]("PodGroup ns/gang is pending")
        wait_for(lambda: service.rounds > rounds, "the triggered round")
        metrics = get(port, "/metrics")[1]
        assert "tide_policy_valid 1.0" in metrics and "tide_decisions_total" in metrics
    finally:
        stop.set()
        run.join(WAIT_S)
    assert codes == [0] and not run.is_alive()
    assert link.stopped and not service.running
    record = link.leases.read()
    assert record is not None and not record.held  # released on the way out
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)


def test_sigterm_and_sigint_set_the_stop_event_then_the_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    for signum in (signal.SIGTERM, signal.SIGINT):
        stop = threading.Event()
        with stop_on_signals(stop):
            os.kill(os.getpid(), signum)
            assert stop.wait(WAIT_S)
    assert signal.getsignal(signal.SIGTERM) == before


def test_the_json_log_lines_carry_the_decision_fields(
    policy_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    link = FakeLink(cluster())
    with json_logging():
        run_once(options(policy_file, once=True, dry_run=True), connect=lambda _o: link,
                 metrics=lambda _p: link.fake)  # fmt: skip
    lines = [
        json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")
    ]
    decisions = [line for line in lines if line["logger"] == "tide.engine.decisions"]
    assert [d["job"] for d in decisions] == ["ns/a"]
    fields = {"time", "level", "queue", "current", "target", "reason", "message", "budget_gpus",
              "queue_allocated_gpus", "throughput_points", "stale_reason"}  # fmt: skip
    assert fields <= set(decisions[0])
    (summary,) = [line for line in lines if line["logger"] == "tide.engine.rounds"]
    assert summary["dry_run"] and summary["would_apply"] == 1
