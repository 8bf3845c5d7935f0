"""Helpers for tests that start real torchrun agents on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("elastic_script.py")
# Short keep-alive so that agents notice departed peers in seconds, not the default 15 s.
RDZV_CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=5"


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def read_events(log_dir: Path) -> list[dict[str, Any]]:
    """Every event the workers logged, in the order they were logged (by their ``time_s``).

    Not in the order of the files' names: those hold pids, which wrap (at 32,768 here) and
    change length, so a restarted worker's file can sort before its predecessor's.
    """
    events: list[dict[str, Any]] = []
    for path in log_dir.glob("events-*.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                events.append(json.loads(line))
    # Stable: a process's own events keep their file order even where two times are equal.
    events.sort(key=lambda e: float(e["time_s"]))
    return events


def wait_for(predicate: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    """Poll ``predicate`` every 50 ms until it holds; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")


@dataclass
class Cluster:
    """Torchrun agents of one job on loopback, all killed (process groups) at teardown."""

    tmp: Path
    port: int = field(default_factory=free_port)
    agents: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def ckpt_dir(self) -> Path:
        return self.tmp / "ckpt"

    @property
    def log_dir(self) -> Path:
        return self.tmp / "log"

    def start_agent(
        self,
        *script_args: str,
        nproc: int = 1,
        nnodes: str = "1:3",
        max_restarts: int = 3,
        script: Path = SCRIPT,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start one torchrun agent (its own process group) running ``script`` (with ``env``)."""
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}",
            "--monitor-interval=0.1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self.port}",
            # The first agent hosts the store; said explicitly, or a later agent on loopback
            # may bind the same port (SO_REUSEPORT) and form a rendezvous of its own.
            f"--rdzv-conf={RDZV_CONF},is_host={int(not self.agents)}",
            "--rdzv-id=tide-test",
            str(script),
            "--ckpt-dir",
            str(self.ckpt_dir),
            "--log-dir",
            str(self.log_dir),
            *script_args,
        ]
        # torch 2.13: with the agent's rendezvous store shared with the workers (the default),
        # the store outlives a round and the process group's keys carry no round prefix, so a
        # restarted worker can read a peer's gloo address from the previous round and fail to
        # connect. See the comment in manifests/examples/elastic-pytorch-job.yaml.
        return self.start_command(
            cmd, env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **(env or {})}
        )

    def start_command(self, cmd: list[str], *, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start an agent from a whole command line, in its own session, logging to a file.

        ``env`` is added to this process's environment, with ``PYTHONPATH`` at the repository
        so that the workers import this checkout. Its workers are killed at teardown when their
        command line names ``tmp`` (or they recorded their pid).
        """
        full_env = dict(os.environ, PYTHONPATH=str(REPO), **env)
        full_env.pop("TIDE_METRICS_PORT", None)
        out = open(self.agent_log(len(self.agents)), "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            cmd, env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.agents.append(proc)
        return proc

    def agent_log(self, index: int) -> Path:
        """Where the agent started ``index``-th (from 0) writes its output."""
        return self.tmp / f"agent-{index}.log"

    def events(self) -> list[dict[str, Any]]:
        return read_events(self.log_dir)

    def wait_agent(self, proc: subprocess.Popen[bytes], *, timeout_s: float) -> int:
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"agent {proc.pid} still running after {timeout_s} s\n{self.agent_logs()}")

    def agent_logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-3000:] for p in self.tmp.glob("agent-*.log")
        )

    def kill_all(self) -> None:
        # Workers run in sessions of their own: kill them by the pids they recorded, or, for
        # scripts that record none, by the job directory their command line names.
        pids = {int(m.name.removeprefix("pid-")) for m in self.log_dir.glob("pid-*")}
        pids |= self._pids_naming_tmp()
        for pid in pids:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if SCRIPT.name.encode() in cmdline or f"{self.tmp}/".encode() in cmdline:
                    os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, FileNotFoundError):
                pass
        for proc in self.agents:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def _pids_naming_tmp(self) -> set[int]:
        found: set[int] = set()
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and int(proc.name) != os.getpid():
                with contextlib.suppress(OSError):
                    if f"{self.tmp}/".encode() in (proc / "cmdline").read_bytes():
                        found.add(int(proc.name))
        return found


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A fresh job directory; every agent started through it is killed at teardown."""
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.kill_all()
