"""The command line of each control-plane component, with the reason for every flag that is
not obvious. Everything listens on 127.0.0.1 only."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

FAKE_NODE_SELECTOR = "kwok.x-k8s.io/node=fake"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

# client-go's streaming list needs etcd's watch progress requests (etcd >= 3.4.31); Debian's
# 3.4.23 lacks them, and KWOK's informers would retry a refused stream again and again.
# Plain LIST + WATCH works.
KWOK_ENV: Mapping[str, str] = {"KUBE_FEATURE_WatchListClient": "false"}


def etcd_argv(binary: Path, *, data_dir: Path, client_url: str, peer_url: str) -> list[str]:
    """One etcd 3.4 member serving ``client_url``, without fsync (test data only)."""
    return [
        str(binary),
        "--name=tide-test",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=tide-test={peer_url}",
        "--unsafe-no-fsync",
        "--logger=zap",
        "--log-level=warn",
    ]


def apiserver_argv(
    binary: Path,
    *,
    etcd_url: str,
    port: int,
    pki: Mapping[str, Path],
    token_file: Path,
    audit_policy: Path,
    audit_log: Path,
) -> list[str]:
    """kube-apiserver on ``https://127.0.0.1:<port>`` with RBAC, token auth and an audit log.

    Args:
        binary: the kube-apiserver binary.
        etcd_url: etcd's client URL.
        port: the secure port.
        pki: the paths ``write_pki`` returned (ca, serving_cert, serving_key, sa_key, sa_pub).
        token_file: the static tokens (``token,user,uid,"group,..."`` lines).
        audit_policy: the audit policy file.
        audit_log: where the audit events go (JSON lines).
    """
    return [
        str(binary),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        # Where it would write self-signed certificates: never /var/run/kubernetes.
        f"--cert-dir={pki['ca'].parent}",
        f"--tls-cert-file={pki['serving_cert']}",
        f"--tls-private-key-file={pki['serving_key']}",
        f"--client-ca-file={pki['ca']}",
        f"--token-auth-file={token_file}",
        "--authorization-mode=RBAC",
        # With the signing key the API server serves TokenRequest itself: no controller manager.
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki['sa_pub']}",
        f"--service-account-signing-key-file={pki['sa_key']}",
        "--service-cluster-ip-range=10.0.0.0/24",
        # Pods need no ServiceAccount token secret (nothing would create it), and fake nodes no
        # taints from conditions.
        "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
        "--allow-privileged=true",
        f"--audit-policy-file={audit_policy}",
        f"--audit-log-path={audit_log}",
        # Written by the request's own handler, none batched or dropped: a test reads it soon.
        "--audit-log-mode=blocking",
        "--audit-log-maxbackup=0",
        "--profiling=false",
        # etcd 3.4.23 lacks the watch progress requests that streaming lists need; without the
        # gate the server answers client-go's streaming-list watches with an error again and
        # again (its clients then see new objects late).
        "--feature-gates=WatchList=false",
    ]


def kwok_argv(binary: Path, *, kubeconfig: Path, config: Path) -> list[str]:
    """KWOK out of cluster, managing only the nodes annotated ``kwok.x-k8s.io/node: fake``."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={config}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={FAKE_NODE_SELECTOR}",
        "--node-lease-duration-seconds=40",
        # Pod IPs: any range apart from the service range (10.0.0.0/24).
        "--cidr=10.244.0.1/16",
    ]
