"""Volcano v1.15.1's own scheduler, controller manager and webhook manager, run out of cluster on
the test control plane (``tests/cluster/controlplane.py``).

The binaries are not built by the project: ``TIDE_VOLCANO_BIN`` names a folder that holds
``vc-scheduler``, ``vc-controller-manager`` and ``vc-webhook-manager`` (Volcano's module is not
served by the Go module proxy, so CI has none and these tests skip there, saying so).

What this module sets up, as Volcano's Helm chart would in a cluster:

- the webhook manager serves its admission paths over TLS on 127.0.0.1 with the plane's serving
  certificate; the ``MutatingWebhookConfiguration``/``ValidatingWebhookConfiguration`` objects
  the chart would install (``volcano-admission-service-<path>``, the names the manager looks up
  to patch their caBundle: ``../shared/volcano-crds/SOURCE.txt``) point at it by URL;
- the controller manager runs the controllers a batch Job needs (job, podgroup, queue, gc): the
  others wait for CRDs (jobflows, jobtemplates) the plane does not install;
- the scheduler reads its configuration from a folder of its own (the recordings' README: it
  hot-reloads by watching the folder, thousands of times a second when other files change there).
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.cluster.components import KWOK_ENV
from tests.cluster.controlplane import ControlPlane
from tests.cluster.processes import ManagedProcess, free_port, wait_until

BIN_ENV = "TIDE_VOLCANO_BIN"
BINARIES = ("vc-scheduler", "vc-controller-manager", "vc-webhook-manager")
CONTROLLERS = "job-controller,pg-controller,queue-controller,gc-controller"

# The chart's webhooks (../shared/volcano-crds/SOURCE.txt, the ones the manager enables by
# default): kind, path, webhook name, API group, resource, operations.
WEBHOOKS: tuple[tuple[str, str, str, str, str, tuple[str, ...]], ...] = (
    ("Mutating", "/pods/mutate", "mutatepod.volcano.sh", "", "pods", ("CREATE",)),
    ("Mutating", "/queues/mutate", "mutatequeue.volcano.sh", "scheduling.volcano.sh", "queues",
     ("CREATE",)),
    ("Mutating", "/podgroups/mutate", "mutatepodgroup.volcano.sh", "scheduling.volcano.sh",
     "podgroups", ("CREATE",)),
    ("Mutating", "/jobs/mutate", "mutatejob.volcano.sh", "batch.volcano.sh", "jobs", ("CREATE",)),
    ("Validating", "/jobs/validate", "validatejob.volcano.sh", "batch.volcano.sh", "jobs",
     ("CREATE", "UPDATE")),
    ("Validating", "/pods/validate", "validatepod.volcano.sh", "", "pods", ("CREATE",)),
    ("Validating", "/queues/validate", "validatequeue.volcano.sh", "scheduling.volcano.sh",
     "queues", ("CREATE", "UPDATE", "DELETE")),
)  # fmt: skip
ADMISSION_PATHS = ",".join(path for _, path, *_ in WEBHOOKS)
READY_S = 60.0


def volcano_bin() -> tuple[Path | None, str]:
    """The folder of Volcano's binaries, or None and why not."""
    folder = os.environ.get(BIN_ENV)
    if not folder:
        return None, (
            f"{BIN_ENV} is not set: it names a folder with Volcano v1.15.1's "
            f"{', '.join(BINARIES)} (Volcano's Go module is not served here; build them by hand)"
        )
    missing = [name for name in BINARIES if not os.access(Path(folder) / name, os.X_OK)]
    if missing:
        return None, f"{BIN_ENV}={folder} has no executable {', '.join(missing)}"
    return Path(folder), ""


def _webhook_object(
    plane: ControlPlane, kind: str, path: str, name: str, group: str, resource: str,
    operations: Sequence[str], port: int,
) -> dict[str, Any]:  # fmt: skip
    version = "v1" if group == "" else ("v1alpha1" if group == "batch.volcano.sh" else "v1beta1")
    hook: dict[str, Any] = {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "matchPolicy": "Equivalent",
        "sideEffects": "NoneOnDryRun",
        "timeoutSeconds": 10,
        "failurePolicy": "Fail",
        "clientConfig": {"url": f"https://127.0.0.1:{port}{path}"},
        "namespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["volcano-system", "kube-system"],
                }
            ]
        },
        "rules": [
            {
                "apiGroups": [group],
                "apiVersions": [version],
                "operations": list(operations),
                "resources": [resource],
            }
        ],
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": f"{kind}WebhookConfiguration",
        "metadata": {"name": "volcano-admission-service" + path.replace("/", "-")},
        "webhooks": [hook],
    }


class Volcano:
    """Volcano's three components on ``plane``; :meth:`stop` stops them (idempotent).

    Args:
        plane: the running control plane.
        folder: where the logs, the certificates' copies and the scheduler's conf folder go.
        scheduler_conf: the scheduler configuration's text (YAML).
        bin_dir: the folder of the binaries.
    """

    def __init__(
        self, plane: ControlPlane, folder: Path, *, scheduler_conf: str, bin_dir: Path
    ) -> None:
        self.plane = plane
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.conf_dir = folder / "scheduler-conf"
        self.conf_dir.mkdir(exist_ok=True)
        self.conf_path = self.conf_dir / "volcano-scheduler.conf"
        self.conf_path.write_text(scheduler_conf)
        self.metrics_port = free_port()
        self._bin = bin_dir
        self._processes: list[ManagedProcess] = []

    def _spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        # As for KWOK: Debian's etcd 3.4 cannot serve client-go's streaming lists (WatchList).
        process = ManagedProcess(name, argv, self.folder / f"{name}.log", env=KWOK_ENV)
        self._processes.append(process)
        return process

    def start(self) -> Volcano:
        """Starts the webhook manager (and its configurations), the controllers and the scheduler.

        Returns:
            self, once the webhook answers and the scheduler serves its metrics.
        """
        kubeconfig = str(self.plane.kubeconfig_path)
        pki = self.plane.workdir / "pki"
        port = free_port()
        self._install_webhooks(port)
        self._spawn(
            "vc-webhook-manager",
            [
                str(self._bin / "vc-webhook-manager"),
                f"--kubeconfig={kubeconfig}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--ca-cert-file={self.plane.ca_file}",
                "--listen-address=127.0.0.1",
                f"--port={port}",
                f"--webhook-url=https://127.0.0.1:{port}",
                f"--enabled-admission={ADMISSION_PATHS}",
                f"--healthz-address=127.0.0.1:{free_port()}",
            ],
        )
        self._spawn(
            "vc-controller-manager",
            [
                str(self._bin / "vc-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                "--leader-elect=false",
                f"--controllers={CONTROLLERS}",
                f"--healthz-address=127.0.0.1:{free_port()}",
                f"--listen-address=127.0.0.1:{free_port()}",
            ],
        )
        self._spawn(
            "vc-scheduler",
            [
                str(self._bin / "vc-scheduler"),
                f"--kubeconfig={kubeconfig}",
                "--leader-elect=false",
                f"--scheduler-conf={self.conf_path}",
                "--schedule-period=1s",
                "--enable-metrics",
                f"--listen-address=127.0.0.1:{self.metrics_port}",
                f"--healthz-address=127.0.0.1:{free_port()}",
            ],
        )
        wait_until(
            "Volcano's webhook manager patching its configurations and serving",
            lambda: self._check() and self._webhook_ready(port),
            timeout_s=READY_S,
            interval_s=0.5,
        )
        return self

    def _check(self) -> bool:
        for process in self._processes:
            process.check_running()
        return True

    def _install_webhooks(self, port: int) -> None:
        from kubernetes import client

        with self.plane.api_client() as api:
            admission = client.AdmissionregistrationV1Api(api)
            for kind, path, name, group, resource, operations in WEBHOOKS:
                body = _webhook_object(
                    self.plane, kind, path, name, group, resource, operations, port
                )
                if kind == "Mutating":
                    admission.create_mutating_webhook_configuration(body)
                else:
                    admission.create_validating_webhook_configuration(body)

    def _webhook_ready(self, port: int) -> bool:
        from kubernetes import client

        with self.plane.api_client() as api:
            admission = client.AdmissionregistrationV1Api(api)
            configs = [
                *admission.list_validating_webhook_configuration().items,
                *admission.list_mutating_webhook_configuration().items,
            ]
        ours = [c for c in configs if c.metadata.name.startswith("volcano-admission-service")]
        if not all(hook.client_config.ca_bundle for c in ours for hook in c.webhooks):
            return False
        context = ssl.create_default_context(cafile=str(self.plane.ca_file))
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=2) as sock,
                context.wrap_socket(sock, server_hostname="127.0.0.1"),
            ):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """Stops every component and removes the webhook configurations (idempotent)."""
        for process in reversed(self._processes):
            process.stop()
        self._processes.clear()
        from kubernetes import client

        with self.plane.api_client() as api:
            admission = client.AdmissionregistrationV1Api(api)
            for kind, path, *_ in WEBHOOKS:
                name = "volcano-admission-service" + path.replace("/", "-")
                try:
                    if kind == "Mutating":
                        admission.delete_mutating_webhook_configuration(name)
                    else:
                        admission.delete_validating_webhook_configuration(name)
                except client.ApiException as e:
                    if e.status != 404:
                        raise

    def logs(self) -> dict[str, str]:
        """Each component's log."""
        return {p.name: p.log_path.read_text(errors="replace") for p in self._processes}
