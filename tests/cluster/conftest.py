"""The session's control plane and per-test namespaces for the cluster tests.

Every test under ``tests/cluster/`` is marked ``cluster``. The plane starts once per session, on
first use; a test takes its own namespace (``namespace`` fixture) and its own queue names, since
the plane is shared. When a binary is missing the tests skip with the command that builds it
(``make cluster-deps``), except under CI (``CI=true``), where they fail.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cluster.controlplane import ControlPlane, binaries_present


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.cluster)


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set to 1/true/yes), where a missing binary is a failure."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_control_plane_binaries() -> None:
    """Skips the test when a control-plane binary is missing, or fails it under CI."""
    ok, why = binaries_present()
    if ok:
        return
    if in_ci():
        pytest.fail(f"CI: {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def control_plane(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> ControlPlane:
    """etcd + kube-apiserver v1.36.3 (Volcano's CRDs and policies) + KWOK, shared by the session.

    A failed start stops what it had started before the error reaches the test; a started plane
    stops at the end of the session, whatever the tests did.
    """
    require_control_plane_binaries()
    plane = ControlPlane.start(tmp_path_factory.mktemp("control-plane"))
    request.addfinalizer(plane.stop)
    return plane


@pytest.fixture
def namespace(control_plane: ControlPlane) -> str:
    """A fresh namespace on the session's plane for one test (left in place: no controller
    manager runs to finish a namespace deletion)."""
    return control_plane.new_namespace()
