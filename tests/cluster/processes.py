"""Child processes of the control plane, and the bounded waits its start is made of.

Every process runs in its own session (a Ctrl-C on pytest reaches it only through the fixture's
finalizer) and is told by the kernel to stop when the process that started it dies
(``PR_SET_PDEATHSIG``), so a pytest killed by ``timeout`` or SIGKILL leaves no etcd,
kube-apiserver or KWOK behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

STOP_GRACE_S = 10.0
LOG_TAIL_LINES = 30
_PR_SET_PDEATHSIG = 1


class ControlPlaneError(RuntimeError):
    """The control plane could not start, or an operation on it failed."""


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGKILL it when its parent thread exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file, or a note saying why there are none."""
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"(no log: {e})"
    return "\n".join(text.splitlines()[-lines:])


def wait_until(
    what: str, probe: Callable[[], bool], *, timeout_s: float, interval_s: float = 0.2
) -> None:
    """Calls ``probe`` until True; past the bound, raises ControlPlaneError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if probe():
            return
        if time.monotonic() >= deadline:
            raise ControlPlaneError(f"{what}: not reached within {timeout_s:g} s")
        time.sleep(interval_s)


# -- processes -----------------------------------------------------------------------------------


class ManagedProcess:
    """One child process with its output in a log file, stopped by TERM, then KILL after a bound.

    Args:
        name: what the messages call it (etcd, kube-apiserver, kwok).
        argv: the command line.
        log_path: the file that receives its stdout and stderr.
        env: variables added to this process's environment, if any.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
                env=None if env is None else {**os.environ, **env},
            )

    @property
    def pid(self) -> int:
        """Its process id."""
        return self.popen.pid

    def running(self) -> bool:
        """Whether it has not exited yet."""
        return self.popen.poll() is None

    def check_running(self) -> None:
        """Raises ControlPlaneError with the end of the log when the process has exited."""
        code = self.popen.poll()
        if code is not None:
            raise ControlPlaneError(
                f"{self.name} exited with code {code}; last lines of {self.log_path}:\n"
                f"{tail(self.log_path)}"
            )

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM, then SIGKILL when it has not exited after ``grace_s``; reaps it. Idempotent."""
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
            self.popen.wait(timeout=grace_s)
