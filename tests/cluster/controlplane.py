"""A real Kubernetes control plane on loopback for the cluster tests: etcd, kube-apiserver, KWOK.

What runs (all on free 127.0.0.1 ports, all files in one temporary folder):

- Debian's etcd 3.4 (``/usr/bin/etcd``), one member, no fsync;
- kube-apiserver v1.36.3 built by ``make cluster-deps`` into ``~/.cache/tide`` (``TIDE_CACHE``),
  with certificates made here (a CA, a serving certificate for 127.0.0.1/localhost, an RSA
  service-account key), a static admin token in ``system:masters``, RBAC, and an audit log
  (level Metadata, every request, blocking) so tests can read which requests the API saw;
- Volcano v1.15.1's CRDs and its own ValidatingAdmissionPolicies from ``../shared/volcano-crds/``,
  in force before :meth:`ControlPlane.start` returns (Volcano's webhooks are not installed:
  there is no Volcano binary; the policies enforce the same update rules);
- KWOK v0.7.0 with the stages of ``../shared/kwok-stages/``: it makes the nodes annotated
  ``kwok.x-k8s.io/node: fake`` Ready and the pods bound to them Running.

No kube-controller-manager and no scheduler run: nothing creates ServiceAccount token secrets
(use the TokenRequest API, which the apiserver serves with its signing key), nothing binds pods
(set ``spec.nodeName`` or create a Binding), nothing garbage-collects, and nothing sets a Queue's
``status.state`` (:meth:`ControlPlane.create_queue` sets it through the status subresource).

Typical use (the session fixture ``control_plane`` in ``tests/cluster/conftest.py`` does this)::

    plane = ControlPlane.start(tmp_dir)
    try:
        core = kubernetes.client.CoreV1Api(plane.api_client())
        ...
    finally:
        plane.stop()
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import ssl
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.audit import AUDIT_POLICY, AuditLogReader, AuditRequest, parse_audit_event
from tests.cluster.components import KWOK_ENV, apiserver_argv, etcd_argv, kwok_argv
from tests.cluster.pki import kubeconfig_text, write_pki
from tests.cluster.processes import (
    ControlPlaneError,
    ManagedProcess,
    free_port,
    tail,
    wait_until,
)
from tests.cluster.volcano_objects import (
    GPU_RESOURCE,
    JOB_GROUP,
    JOB_VERSION,
    KWOK_STAGES_DIR,
    QUEUE_GROUP,
    QUEUE_VERSION,
    SHARED_DIR,
    VOLCANO_CRDS_DIR,
    gpu_node_body,
    install_volcano,
    kwok_stages_config,
    queue_body,
    volcano_job_body,
)

__all__ = [
    "GPU_RESOURCE",
    "JOB_GROUP",
    "JOB_VERSION",
    "QUEUE_GROUP",
    "QUEUE_VERSION",
    "SHARED_DIR",
    "VOLCANO_CRDS_DIR",
    "AuditRequest",
    "ControlPlane",
    "ControlPlaneError",
    "binaries_present",
    "binary_paths",
    "cache_dir",
    "free_port",
    "parse_audit_event",
    "queue_body",
    "volcano_job_body",
]

KUBE_VERSION = "1.36.3"
KWOK_VERSION = "0.7.0"
ETCD = Path("/usr/bin/etcd")
BUILD_COMMAND = "make cluster-deps"

ADMIN_USER = "tide-admin"

# How long each start phase may take on a busy 2-core machine before the start fails.
ETCD_READY_S = 30.0
APISERVER_READY_S = 60.0
CRDS_ESTABLISHED_S = 30.0
POLICIES_IN_FORCE_S = 30.0
NODE_READY_S = 30.0
# A port picked free can be taken by another process before etcd or the API server binds it.
BIND_ATTEMPTS = 3


def cache_dir() -> Path:
    """Where ``make cluster-deps`` keeps the binaries: ``$TIDE_CACHE``, else ``~/.cache/tide``."""
    configured = os.environ.get("TIDE_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "tide"


def binary_paths() -> dict[str, Path]:
    """The path of each binary the plane runs, by name (etcd, kube-apiserver, kwok)."""
    cache = cache_dir()
    return {
        "etcd": ETCD,
        "kube-apiserver": cache / f"kube-apiserver-{KUBE_VERSION}" / "bin" / "kube-apiserver",
        "kwok": cache / f"kwok-{KWOK_VERSION}" / "bin" / "kwok",
    }


def binaries_present() -> tuple[bool, str]:
    """Whether every binary and the shared Volcano/KWOK files are on this machine.

    Returns:
        (True, "") when the plane can start, else (False, a sentence naming what is missing and
        the command that provides it).
    """
    missing = [
        f"{name} ({path})"
        for name, path in binary_paths().items()
        if not (path.is_file() and os.access(path, os.X_OK))
    ]
    if missing:
        return False, (
            f"the control plane's binaries are missing: {', '.join(missing)}; "
            f"build them with `{BUILD_COMMAND}` (first time about 10 min on 2 cores)"
        )
    for folder in (VOLCANO_CRDS_DIR, KWOK_STAGES_DIR):
        if not folder.is_dir():
            return False, (
                f"{folder} is missing (the shared Volcano and KWOK files sit beside the checkout)"
            )
    return True, ""


def _address_in_use(error: ControlPlaneError) -> bool:
    return "address already in use" in str(error)


class ControlPlane:
    """A running etcd + kube-apiserver + KWOK on loopback. Make one with :meth:`start`.

    The attributes are read-only: tests share one plane per session and must not reconfigure it.
    Each test takes its own namespace (:meth:`new_namespace`) and its own queue names.
    """

    def __init__(self, workdir: Path) -> None:
        """Lays out the folder; starts nothing (see :meth:`start`)."""
        self._workdir = workdir
        self._processes: list[ManagedProcess] = []
        self._admin_token = secrets.token_hex(16)
        self._apiserver_port = 0
        self._pki: dict[str, Path] = {}
        self._version = ""
        self._audit_log = workdir / "audit.log"
        self._audit = AuditLogReader(self._audit_log)
        self._etcd_url = ""
        self._kubeconfig = workdir / "admin.kubeconfig"
        self._start_timings_s: dict[str, float] = {}

    # -- read-only facts ------------------------------------------------------------------------

    @property
    def workdir(self) -> Path:
        """The temporary folder holding every file and log of this plane."""
        return self._workdir

    @property
    def url(self) -> str:
        """The API server's https URL on 127.0.0.1."""
        return f"https://127.0.0.1:{self._apiserver_port}"

    @property
    def ca_file(self) -> Path:
        """The CA certificate that signed the API server's serving certificate."""
        return self._pki["ca"]

    @property
    def admin_token(self) -> str:
        """A bearer token of user ``tide-admin`` in group ``system:masters``."""
        return self._admin_token

    @property
    def kubeconfig_path(self) -> Path:
        """An admin kubeconfig file (token auth) for tools such as helm and KWOK."""
        return self._kubeconfig

    @property
    def audit_log_path(self) -> Path:
        """The API server's audit log (JSON lines)."""
        return self._audit_log

    @property
    def version(self) -> str:
        """The API server's ``/version`` gitVersion, e.g. ``v1.36.3``."""
        return self._version

    @property
    def start_timings_s(self) -> dict[str, float]:
        """How long each start phase took (etcd, kube-apiserver, volcano, kwok), in seconds."""
        return dict(self._start_timings_s)

    @property
    def pids(self) -> dict[str, int]:
        """The process id of each running component, by name (etcd, kube-apiserver, kwok)."""
        return {p.name: p.pid for p in self._processes}

    # -- lifecycle ------------------------------------------------------------------------------

    @classmethod
    def start(cls, workdir: Path) -> ControlPlane:
        """Starts etcd, kube-apiserver (with Volcano's CRDs and policies) and KWOK in ``workdir``.

        Args:
            workdir: an empty folder this plane owns (data, certificates, logs).

        Returns:
            The running plane, every CRD established and every policy in force.

        Raises:
            ControlPlaneError: a binary is missing, or a component did not become ready within
                its bound (the message carries the end of its log). Everything started so far is
                stopped before the error propagates.

        The components die with the thread that started them (``PR_SET_PDEATHSIG``): start a
        plane from the main thread, or from a thread that outlives its use.
        """
        ok, why = binaries_present()
        if not ok:
            raise ControlPlaneError(why)
        workdir.mkdir(parents=True, exist_ok=True)
        plane = cls(workdir)
        try:
            for phase, step in (
                ("etcd", plane._start_etcd),
                ("kube-apiserver", plane._start_apiserver),
                ("volcano", plane._install_volcano),
                ("kwok", plane._start_kwok),
            ):
                began = time.monotonic()
                plane._retry_taken_port(phase, step)
                plane._start_timings_s[phase] = time.monotonic() - began
        except BaseException:
            plane.stop()
            raise
        # A session that ends without its finalizer (an error in pytest itself) still stops it.
        atexit.register(plane._stop_at_exit)
        return plane

    def _retry_taken_port(self, phase: str, step: Callable[[], None]) -> None:
        """Runs a start step again (new ports) when its process lost a port race, up to a bound."""
        for attempt in range(1, BIND_ATTEMPTS + 1):
            try:
                step()
                return
            except ControlPlaneError as e:
                if attempt == BIND_ATTEMPTS or not _address_in_use(e):
                    raise
                for process in [p for p in self._processes if p.name == phase]:
                    process.stop()
                    self._processes.remove(process)
                    process.log_path.rename(process.log_path.with_suffix(f".{attempt}.log"))

    def _stop_at_exit(self) -> None:
        # At exit nothing can act on an error; the kernel kills the rest (PR_SET_PDEATHSIG).
        with contextlib.suppress(ControlPlaneError):
            self.stop()

    def stop(self) -> None:
        """Stops every component (TERM, then KILL after a bound), newest first. Idempotent."""
        errors: list[str] = []
        for process in reversed(self._processes):
            try:
                process.stop()
            except Exception as e:  # keep stopping the others
                errors.append(f"{process.name} (pid {process.pid}): {e}")
        self._processes.clear()
        if errors:
            raise ControlPlaneError("could not stop: " + "; ".join(errors))

    def running(self) -> bool:
        """True while every component is alive."""
        return bool(self._processes) and all(p.running() for p in self._processes)

    def _spawn(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> ManagedProcess:
        process = ManagedProcess(name, argv, self._workdir / f"{name}.log", env)
        self._processes.append(process)
        return process

    def _start_etcd(self) -> None:
        data_dir = self._workdir / "etcd"
        shutil.rmtree(data_dir, ignore_errors=True)  # a retry must not reuse a member's data
        client_port, peer_port = free_port(), free_port()
        client_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        etcd = self._spawn(
            "etcd",
            etcd_argv(
                binary_paths()["etcd"], data_dir=data_dir, client_url=client_url, peer_url=peer_url
            ),
        )
        self._etcd_url = client_url

        def healthy() -> bool:
            etcd.check_running()
            try:
                with urllib.request.urlopen(f"{client_url}/health", timeout=2) as response:
                    return bool(json.load(response).get("health") == "true")
            except (OSError, ValueError):
                return False

        try:
            wait_until("etcd /health", healthy, timeout_s=ETCD_READY_S)
        except ControlPlaneError as e:
            raise ControlPlaneError(
                f"{e}; last lines of {etcd.log_path}:\n{tail(etcd.log_path)}"
            ) from None

    def _start_apiserver(self) -> None:
        self._pki = write_pki(self._workdir / "pki")
        tokens = self._workdir / "tokens.csv"
        tokens.write_text(f'{self._admin_token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
        tokens.chmod(0o600)
        audit_policy = self._workdir / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        self._apiserver_port = free_port()
        apiserver = self._spawn(
            "kube-apiserver",
            apiserver_argv(
                binary_paths()["kube-apiserver"],
                etcd_url=self._etcd_url,
                port=self._apiserver_port,
                pki=self._pki,
                token_file=tokens,
                audit_policy=audit_policy,
                audit_log=self._audit_log,
            ),
        )
        self._write_kubeconfig(self._kubeconfig, self._admin_token, user=ADMIN_USER)
        context = ssl.create_default_context(cafile=str(self._pki["ca"]))

        def ready() -> bool:
            apiserver.check_running()
            request = urllib.request.Request(
                f"{self.url}/readyz", headers={"Authorization": f"Bearer {self._admin_token}"}
            )
            try:
                with urllib.request.urlopen(request, timeout=5, context=context) as response:
                    return bool(response.status == 200)
            except (OSError, urllib.error.HTTPError):
                return False

        try:
            wait_until("kube-apiserver /readyz", ready, timeout_s=APISERVER_READY_S, interval_s=0.5)
        except ControlPlaneError as e:
            raise ControlPlaneError(
                f"{e}; last lines of {apiserver.log_path}:\n{tail(apiserver.log_path)}"
            ) from None
        request = urllib.request.Request(
            f"{self.url}/version", headers={"Authorization": f"Bearer {self._admin_token}"}
        )
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            self._version = str(json.load(response)["gitVersion"])

    def _install_volcano(self) -> None:
        with self.api_client() as api:
            install_volcano(
                api, established_s=CRDS_ESTABLISHED_S, policies_in_force_s=POLICIES_IN_FORCE_S
            )

    def _start_kwok(self) -> None:
        config = self._workdir / "kwok.yaml"
        config.write_text(kwok_stages_config())
        self._spawn(
            "kwok",
            kwok_argv(binary_paths()["kwok"], kubeconfig=self._kubeconfig, config=config),
            env=KWOK_ENV,
        )

    # -- clients --------------------------------------------------------------------------------

    def _write_kubeconfig(self, path: Path, token: str, *, user: str) -> None:
        path.write_text(
            kubeconfig_text(server=self.url, ca_file=self.ca_file, token=token, user=user)
        )
        path.chmod(0o600)

    def kubeconfig_for_token(self, token: str) -> Path:
        """A kubeconfig file in the plane's folder that authenticates with ``token``.

        Args:
            token: a bearer token (e.g. a ServiceAccount token from the TokenRequest API).

        Returns:
            The file's path (a new file per call).
        """
        path = self._workdir / f"token-{uuid.uuid4().hex[:8]}.kubeconfig"
        self._write_kubeconfig(path, token, user="token-user")
        return path

    def api_client_for_token(self, token: str) -> Any:
        """A fresh ``kubernetes.client.ApiClient`` that authenticates with ``token``.

        Args:
            token: a bearer token.

        Returns:
            The client (close it, or use it as a context manager).
        """
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        configuration.ssl_ca_cert = str(self.ca_file)
        configuration.api_key = {"authorization": f"Bearer {token}"}
        return client.ApiClient(configuration)

    def api_client(self) -> Any:
        """A fresh ``kubernetes.client.ApiClient`` for the admin (``system:masters``)."""
        return self.api_client_for_token(self._admin_token)

    # -- objects --------------------------------------------------------------------------------

    def new_namespace(self, prefix: str = "t") -> str:
        """Creates a namespace with a fresh name and returns the name.

        Args:
            prefix: the start of the name (a DNS label).
        """
        from kubernetes import client

        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        with self.api_client() as api:
            client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
        return name

    def add_gpu_node(
        self, name: str, gpus: int = 8, cpu: str = "64", memory: str = "512Gi"
    ) -> dict[str, Any]:
        """Creates a fake node that KWOK manages and waits until it is Ready.

        Args:
            name: the node's name.
            gpus: its ``nvidia.com/gpu`` capacity and allocatable.
            cpu: its CPU capacity (a Kubernetes quantity).
            memory: its memory capacity (a Kubernetes quantity).

        Returns:
            The Ready node, as the API returns it (a dict).

        Raises:
            ControlPlaneError: the node did not become Ready within the bound.
        """
        from kubernetes import client

        body = gpu_node_body(name, gpus=gpus, cpu=cpu, memory=memory)
        with self.api_client() as api:
            core = client.CoreV1Api(api)
            core.create_node(body)
            node: dict[str, Any] = {}

            def ready() -> bool:
                self._check_running("kwok")
                raw = api.sanitize_for_serialization(core.read_node(name))
                node.update(raw)
                conditions = (raw.get("status") or {}).get("conditions") or []
                return any(
                    c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
                )

            wait_until(f"node {name} Ready (KWOK)", ready, timeout_s=NODE_READY_S)
            return node

    def create_queue(
        self,
        name: str,
        weight: int,
        capability_gpus: int | None = None,
        deserved_gpus: int | None = None,
        guarantee_gpus: int | None = None,
    ) -> dict[str, Any]:
        """Creates a Volcano Queue and sets its ``status.state`` to Open (as Volcano would).

        Args:
            name: the queue's name (cluster-scoped: pick a name no other test uses).
            weight: its ``spec.weight``.
            capability_gpus: ``spec.capability[nvidia.com/gpu]``, omitted when None.
            deserved_gpus: ``spec.deserved[nvidia.com/gpu]``, omitted when None.
            guarantee_gpus: ``spec.guarantee.resource[nvidia.com/gpu]``, omitted when None.

        Returns:
            The stored queue with its status (a dict).
        """
        from kubernetes import client

        body = queue_body(
            name,
            weight=weight,
            capability_gpus=capability_gpus,
            deserved_gpus=deserved_gpus,
            guarantee_gpus=guarantee_gpus,
        )
        with self.api_client() as api:
            custom = client.CustomObjectsApi(api)
            custom.create_cluster_custom_object(QUEUE_GROUP, QUEUE_VERSION, "queues", body)
            queue: dict[str, Any] = custom.patch_cluster_custom_object_status(
                QUEUE_GROUP,
                QUEUE_VERSION,
                "queues",
                name,
                {"status": {"state": "Open"}},
                _content_type="application/merge-patch+json",
            )
            return queue

    def _check_running(self, name: str) -> None:
        for process in self._processes:
            if process.name == name:
                process.check_running()
                return
        raise ControlPlaneError(f"{name} is not running (the plane is stopped)")

    # -- audit ----------------------------------------------------------------------------------

    def audit_requests(self, since: float | None = None) -> list[AuditRequest]:
        """The requests the API server logged, oldest first.

        Args:
            since: keep only requests received at or after this time (seconds since the epoch,
                e.g. a ``time.time()`` taken before the requests of interest).

        Returns:
            One AuditRequest per request. The log is written when the response is complete, so
            a request answered a few milliseconds ago may still be missing: see
            :meth:`wait_for_audit`.
        """
        return self._audit.requests(since)

    def wait_for_audit(
        self,
        match: Callable[[AuditRequest], bool],
        *,
        since: float | None = None,
        timeout_s: float = 10.0,
    ) -> list[AuditRequest]:
        """The logged requests that ``match``, waiting (bounded) until there is at least one.

        Args:
            match: which requests to keep.
            since: as in :meth:`audit_requests`.
            timeout_s: how long to wait for the first match.

        Returns:
            Every matching request, oldest first (at least one).

        Raises:
            ControlPlaneError: none matched within ``timeout_s``.
        """
        found: list[AuditRequest] = []

        def any_match() -> bool:
            found[:] = [r for r in self.audit_requests(since) if match(r)]
            return bool(found)

        wait_until("a matching audit event", any_match, timeout_s=timeout_s, interval_s=0.1)
        return found

    def logs(self) -> Iterator[tuple[str, str]]:
        """(component, last lines of its log) for each component, for failure messages."""
        for name in ("etcd", "kube-apiserver", "kwok"):
            path = self._workdir / f"{name}.log"
            if path.exists():
                yield name, tail(path)
