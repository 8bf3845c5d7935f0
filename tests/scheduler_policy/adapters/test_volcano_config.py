"""Where the Volcano client's API client comes from: a kubeconfig file, or the pod's account."""

from __future__ import annotations

import pytest

from scheduler_policy.adapters.volcano import from_kubeconfig
from scheduler_policy.vocabulary.errors import PermanentError


def test_a_missing_kubeconfig_is_a_permanent_error_naming_the_file(tmp_path):
    missing = tmp_path / "nowhere.kubeconfig"
    with pytest.raises(PermanentError, match=r"nowhere\.kubeconfig"):
        from_kubeconfig(str(missing))


def test_a_kubeconfig_without_clusters_is_a_permanent_error_naming_the_file(tmp_path):
    empty = tmp_path / "empty.kubeconfig"
    empty.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    with pytest.raises(PermanentError, match=r"empty\.kubeconfig"):
        from_kubeconfig(str(empty))


def test_outside_a_pod_the_in_cluster_configuration_is_a_permanent_error(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(PermanentError, match="in-cluster configuration"):
        from_kubeconfig(None)
