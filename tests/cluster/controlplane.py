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

import contextlib
import datetime as dt
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

KUBE_VERSION = "1.36.3"
KWOK_VERSION = "0.7.0"
ETCD = Path("/usr/bin/etcd")
BUILD_COMMAND = "make cluster-deps"

REPO_ROOT = Path(__file__).resolve().parents[2]
# The shared ground truth sits beside the checkout (../shared), as CI lays it out.
SHARED_DIR = REPO_ROOT.parent / "shared"
VOLCANO_CRDS_DIR = SHARED_DIR / "volcano-crds"
KWOK_STAGES_DIR = SHARED_DIR / "kwok-stages"

ADMIN_USER = "tide-admin"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
GPU_RESOURCE = "nvidia.com/gpu"
QUEUE_GROUP = "scheduling.volcano.sh"
QUEUE_VERSION = "v1beta1"
JOB_GROUP = "batch.volcano.sh"
JOB_VERSION = "v1alpha1"

# How long each start phase may take on a busy 2-core machine before the start fails.
ETCD_READY_S = 30.0
APISERVER_READY_S = 60.0
CRDS_ESTABLISHED_S = 30.0
POLICIES_IN_FORCE_S = 30.0
NODE_READY_S = 30.0
STOP_GRACE_S = 10.0
LOG_TAIL_LINES = 30


class ControlPlaneError(RuntimeError):
    """The control plane could not start, or an operation on it failed."""


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
            return (
                False,
                f"{folder} is missing (the shared Volcano and KWOK files sit beside the checkout)",
            )
    return True, ""


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"(no log: {e})"
    return "\n".join(text.splitlines()[-lines:])


def _wait_until(
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


class _Process:
    """One child process with its output in a log file, stopped by TERM, then KILL after a bound."""

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
            # Its own session: a Ctrl-C on pytest does not reach it before the finalizer runs.
            self.popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=None if env is None else {**os.environ, **env},
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def check_running(self) -> None:
        """Raises ControlPlaneError with the end of the log when the process has exited."""
        code = self.popen.poll()
        if code is not None:
            raise ControlPlaneError(
                f"{self.name} exited with code {code}; last lines of {self.log_path}:\n"
                f"{_tail(self.log_path)}"
            )

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
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


# -- certificates --------------------------------------------------------------------------------


def _write_pki(folder: Path) -> dict[str, Path]:
    """A CA, a serving certificate for 127.0.0.1/localhost signed by it, and an RSA SA key."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    not_before = now - dt.timedelta(hours=1)
    not_after = now + dt.timedelta(days=2)

    def pem_key(key: Any) -> bytes:
        data: bytes = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return data

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tide-test-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    serving_key = ec.generate_private_key(ec.SECP256R1())
    serving_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(serving_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("kubernetes"),
                    x509.DNSName("kubernetes.default.svc"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    paths = {
        "ca": folder / "ca.crt",
        "serving_cert": folder / "apiserver.crt",
        "serving_key": folder / "apiserver.key",
        "sa_key": folder / "sa.key",
        "sa_pub": folder / "sa.pub",
    }
    paths["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths["serving_cert"].write_bytes(serving_cert.public_bytes(serialization.Encoding.PEM))
    paths["serving_key"].write_bytes(pem_key(serving_key))
    paths["sa_key"].write_bytes(pem_key(sa_key))
    paths["sa_pub"].write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    for key in ("serving_key", "sa_key"):
        paths[key].chmod(0o600)
    return paths


# -- audit ---------------------------------------------------------------------------------------

AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    # One event per request: the one written when the response is complete (it has the code).
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}


@dataclass(frozen=True)
class AuditRequest:
    """One request the API server saw, from its audit log (level Metadata, stage ResponseComplete).

    Attributes:
        user: the authenticated user name (``system:serviceaccount:<ns>:<name>`` for a SA token).
        groups: the user's groups.
        verb: the Kubernetes verb (get, list, watch, create, update, patch, delete, ...).
        api_group: the resource's API group ("" for the core group).
        resource: the resource's plural ("" for a non-resource URL such as /healthz).
        subresource: e.g. "status", "scale", "token", else "".
        namespace: the object's namespace, "" when cluster-scoped.
        name: the object's name, "" for a list or a create without a name.
        code: the HTTP response code.
        request_uri: the path and query the client sent.
        received_at_s: when the request arrived, seconds since the epoch.
    """

    user: str
    groups: tuple[str, ...]
    verb: str
    api_group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    request_uri: str
    received_at_s: float


def _parse_time_s(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def parse_audit_event(event: Mapping[str, Any]) -> AuditRequest:
    """The fields of one audit event (a JSON object of the audit log) tests compare.

    Args:
        event: one line of the log, parsed.

    Returns:
        The request it records.
    """
    user = event.get("user") or {}
    ref = event.get("objectRef") or {}
    status = event.get("responseStatus") or {}
    return AuditRequest(
        user=str(user.get("username", "")),
        groups=tuple(str(g) for g in user.get("groups") or ()),
        verb=str(event.get("verb", "")),
        api_group=str(ref.get("apiGroup", "")),
        resource=str(ref.get("resource", "")),
        subresource=str(ref.get("subresource", "")),
        namespace=str(ref.get("namespace", "")),
        name=str(ref.get("name", "")),
        code=int(status.get("code", 0)),
        request_uri=str(event.get("requestURI", "")),
        received_at_s=_parse_time_s(str(event["requestReceivedTimestamp"])),
    )


# -- the plane -----------------------------------------------------------------------------------


def _stages_config() -> str:
    """The KWOK stages of ../shared/kwok-stages joined with ``---`` into one config document."""
    files = sorted(KWOK_STAGES_DIR.glob("*.yaml"))
    if not files:
        raise ControlPlaneError(f"{KWOK_STAGES_DIR}: no stage files (*.yaml)")
    return "\n---\n".join(f.read_text().strip() for f in files) + "\n"


def _volcano_documents() -> list[dict[str, Any]]:
    """Every object of Volcano's CRD files and admission-policy files, CRDs first."""
    crd_files = sorted(VOLCANO_CRDS_DIR.glob("*.yaml"))
    policy_files = sorted((VOLCANO_CRDS_DIR / "admission-policies").glob("*.yaml"))
    if not crd_files:
        raise ControlPlaneError(f"{VOLCANO_CRDS_DIR}: no CRD files (*.yaml)")
    if not policy_files:
        raise ControlPlaneError(f"{VOLCANO_CRDS_DIR / 'admission-policies'}: no policy files")
    docs: list[dict[str, Any]] = []
    for path in (*crd_files, *policy_files):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                if not isinstance(doc, dict) or "kind" not in doc:
                    raise ControlPlaneError(f"{path}: a document is not a Kubernetes object")
                docs.append(doc)
    return docs


class ControlPlane:
    """A running etcd + kube-apiserver + KWOK on loopback. Make one with :meth:`start`.

    The attributes are read-only: tests share one plane per session and must not reconfigure it.
    Each test takes its own namespace (:meth:`new_namespace`) and its own queue names.
    """

    def __init__(self, workdir: Path) -> None:
        """Lays out the folder; starts nothing (see :meth:`start`)."""
        self._workdir = workdir
        self._processes: list[_Process] = []
        self._admin_token = secrets.token_hex(16)
        self._apiserver_port = 0
        self._pki: dict[str, Path] = {}
        self._version = ""
        self._audit_log = workdir / "audit.log"
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
                step()
                plane._start_timings_s[phase] = time.monotonic() - began
        except BaseException:
            plane.stop()
            raise
        return plane

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
    ) -> _Process:
        process = _Process(name, argv, self._workdir / f"{name}.log", env)
        self._processes.append(process)
        return process

    def _start_etcd(self) -> None:
        client_port, peer_port = free_port(), free_port()
        client_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        etcd = self._spawn(
            "etcd",
            [
                str(binary_paths()["etcd"]),
                "--name=tide-test",
                f"--data-dir={self._workdir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=tide-test={peer_url}",
                "--unsafe-no-fsync",
                "--logger=zap",
                "--log-level=warn",
            ],
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
            _wait_until("etcd /health", healthy, timeout_s=ETCD_READY_S)
        except ControlPlaneError as e:
            raise ControlPlaneError(
                f"{e}; last lines of {etcd.log_path}:\n{_tail(etcd.log_path)}"
            ) from None

    def _start_apiserver(self) -> None:
        self._pki = _write_pki(self._workdir / "pki")
        tokens = self._workdir / "tokens.csv"
        tokens.write_text(f'{self._admin_token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
        tokens.chmod(0o600)
        audit_policy = self._workdir / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        self._apiserver_port = free_port()
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(binary_paths()["kube-apiserver"]),
                f"--etcd-servers={self._etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self._apiserver_port}",
                f"--cert-dir={self._workdir / 'pki'}",
                f"--tls-cert-file={self._pki['serving_cert']}",
                f"--tls-private-key-file={self._pki['serving_key']}",
                f"--client-ca-file={self._pki['ca']}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={self._pki['sa_pub']}",
                f"--service-account-signing-key-file={self._pki['sa_key']}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                "--allow-privileged=true",
                f"--audit-policy-file={audit_policy}",
                f"--audit-log-path={self._audit_log}",
                "--audit-log-mode=blocking",
                "--audit-log-maxbackup=0",
                "--profiling=false",
                # etcd 3.4.23 lacks the watch progress requests that streaming lists need; without
                # the gate the server answers client-go's streaming-list watches with an error
                # again and again (clients then see new objects late).
                "--feature-gates=WatchList=false",
            ],
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
            _wait_until(
                "kube-apiserver /readyz", ready, timeout_s=APISERVER_READY_S, interval_s=0.5
            )
        except ControlPlaneError as e:
            raise ControlPlaneError(
                f"{e}; last lines of {apiserver.log_path}:\n{_tail(apiserver.log_path)}"
            ) from None
        request = urllib.request.Request(
            f"{self.url}/version", headers={"Authorization": f"Bearer {self._admin_token}"}
        )
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            self._version = str(json.load(response)["gitVersion"])

    def _install_volcano(self) -> None:
        from kubernetes import client, utils

        docs = _volcano_documents()
        with self.api_client() as api:
            for doc in docs:
                try:
                    utils.create_from_dict(api, doc)
                except utils.FailToCreateError as e:
                    raise ControlPlaneError(
                        f"creating {doc['kind']} {doc['metadata']['name']}: {e}"
                    ) from e
            crds = [d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"]
            extensions = client.ApiextensionsV1Api(api)

            def established() -> bool:
                listed = extensions.list_custom_resource_definition()
                ok = {
                    item.metadata.name
                    for item in listed.items
                    if any(
                        c.type == "Established" and c.status == "True"
                        for c in (item.status.conditions or ())
                        if item.status
                    )
                }
                return all(name in ok for name in crds)

            _wait_until(
                f"Volcano CRDs Established ({', '.join(crds)})",
                established,
                timeout_s=CRDS_ESTABLISHED_S,
            )
            policies = [
                d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"
            ]
            self._wait_policies_in_force(api, policies)

    def _wait_policies_in_force(self, api: Any, policies: Sequence[str]) -> None:
        """Waits until each policy with a probe refuses, in a dry run, an object it must refuse."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        custom = client.CustomObjectsApi(api)
        core = client.CoreV1Api(api)
        probe_name = f"policy-probe-{uuid.uuid4().hex[:6]}"
        # One object per policy, each breaking exactly one of its rules; dryRun stores nothing.
        probes: dict[str, Callable[[], Any]] = {
            "job-validation-policy": lambda: custom.create_namespaced_custom_object(
                JOB_GROUP,
                JOB_VERSION,
                "default",
                "jobs",
                _volcano_job_body(probe_name, queue="default", replicas=1, min_available=2),
                dry_run="All",
            ),
            "queue-validation-policy": lambda: custom.create_cluster_custom_object(
                QUEUE_GROUP,
                QUEUE_VERSION,
                "queues",
                _queue_body(probe_name, weight=1, capability_gpus=1, deserved_gpus=2),
                dry_run="All",
            ),
            "pod-validation-policy": lambda: core.create_namespaced_pod(
                "default",
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": probe_name,
                        "annotations": {
                            "volcano.sh/jdb-min-available": "1",
                            "volcano.sh/jdb-max-unavailable": "1",
                        },
                    },
                    "spec": {
                        "schedulerName": "volcano",
                        "containers": [{"name": "c", "image": "busybox"}],
                    },
                },
                dry_run="All",
            ),
        }
        for policy in policies:
            probe = probes.get(policy)
            if probe is None:
                continue  # nothing it refuses is worth a probe (the podgroup policy allows all)

            def refused(probe: Callable[[], Any] = probe, policy: str = policy) -> bool:
                try:
                    probe()
                except ApiException as e:
                    if e.status == 422 and policy in str(e.body):
                        return True
                    if e.status == 422:
                        raise ControlPlaneError(
                            f"the {policy} probe was refused by something else: {e.body}"
                        ) from e
                    return False
                return False

            _wait_until(
                f"{policy} in force", refused, timeout_s=POLICIES_IN_FORCE_S, interval_s=0.3
            )

    def _start_kwok(self) -> None:
        config = self._workdir / "kwok.yaml"
        config.write_text(_stages_config())
        self._spawn(
            "kwok",
            [
                str(binary_paths()["kwok"]),
                f"--kubeconfig={self._kubeconfig}",
                f"--config={config}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
                "--node-lease-duration-seconds=40",
                "--cidr=10.244.0.1/16",
            ],
            # client-go's streaming list needs etcd watch progress requests (etcd >= 3.4.31);
            # plain LIST + WATCH works with Debian's 3.4.23.
            env={"KUBE_FEATURE_WatchListClient": "false"},
        )

    # -- clients --------------------------------------------------------------------------------

    def _write_kubeconfig(self, path: Path, token: str, *, user: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "tide-test",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "tide-test", "context": {"cluster": "tide-test", "user": user}}],
            "current-context": "tide-test",
        }
        path.write_text(yaml.safe_dump(config))
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

        resources = {"cpu": cpu, "memory": memory, "pods": "110", GPU_RESOURCE: str(gpus)}
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "type": "kwok",
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/role": "agent",
                },
            },
            "spec": {},
            "status": {"capacity": resources, "allocatable": resources},
        }
        with self.api_client() as api:
            core = client.CoreV1Api(api)
            # A Node keeps the status it is created with (capacity, allocatable); KWOK adds the
            # conditions and addresses and keeps them fresh.
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

            _wait_until(f"node {name} Ready (KWOK)", ready, timeout_s=NODE_READY_S)
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

        body = _queue_body(
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
        found: list[AuditRequest] = []
        try:
            lines = self._audit_log.read_text().splitlines()
        except FileNotFoundError:
            return found
        for line in lines:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # the line being written right now
            request = parse_audit_event(event)
            if since is None or request.received_at_s >= since:
                found.append(request)
        return found

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

        _wait_until("a matching audit event", any_match, timeout_s=timeout_s, interval_s=0.1)
        return found

    def logs(self) -> Iterator[tuple[str, str]]:
        """(component, last lines of its log) for each component, for failure messages."""
        for name in ("etcd", "kube-apiserver", "kwok"):
            path = self._workdir / f"{name}.log"
            if path.exists():
                yield name, _tail(path)


def _resources(gpus: int | None) -> dict[str, str] | None:
    return None if gpus is None else {GPU_RESOURCE: str(gpus)}


def _queue_body(
    name: str,
    *,
    weight: int,
    capability_gpus: int | None = None,
    deserved_gpus: int | None = None,
    guarantee_gpus: int | None = None,
) -> dict[str, Any]:
    """A ``scheduling.volcano.sh/v1beta1`` Queue (GPU figures in whole GPUs)."""
    spec: dict[str, Any] = {"weight": weight, "reclaimable": True}
    if capability_gpus is not None:
        spec["capability"] = _resources(capability_gpus)
    if deserved_gpus is not None:
        spec["deserved"] = _resources(deserved_gpus)
    if guarantee_gpus is not None:
        spec["guarantee"] = {"resource": _resources(guarantee_gpus)}
    return {
        "apiVersion": f"{QUEUE_GROUP}/{QUEUE_VERSION}",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": spec,
    }


def _volcano_job_body(
    name: str, *, queue: str, replicas: int, min_available: int, gpus_per_pod: int = 1
) -> dict[str, Any]:
    """A ``batch.volcano.sh/v1alpha1`` Job with one task ``worker``."""
    return {
        "apiVersion": f"{JOB_GROUP}/{JOB_VERSION}",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "volcano",
            "queue": queue,
            "minAvailable": min_available,
            "tasks": [
                {
                    "name": "worker",
                    "replicas": replicas,
                    "minAvailable": min(1, replicas),
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "worker",
                                    "image": "busybox",
                                    "resources": {
                                        "limits": {GPU_RESOURCE: str(gpus_per_pod)},
                                        "requests": {GPU_RESOURCE: str(gpus_per_pod)},
                                    },
                                }
                            ],
                        }
                    },
                }
            ],
        },
    }


def volcano_job_body(
    name: str, *, queue: str, replicas: int, min_available: int = 1, gpus_per_pod: int = 1
) -> dict[str, Any]:
    """A valid Volcano Job for tests: one elastic task ``worker`` (``tasks[0].minAvailable`` 1).

    Args:
        name: the job's name.
        queue: its ``spec.queue``.
        replicas: ``tasks[0].replicas``.
        min_available: ``spec.minAvailable`` (at most ``replicas``).
        gpus_per_pod: each worker's ``nvidia.com/gpu`` request and limit.

    Returns:
        The body to create (namespace from the create call).
    """
    return _volcano_job_body(
        name, queue=queue, replicas=replicas, min_available=min_available, gpus_per_pod=gpus_per_pod
    )
