"""Tests against Volcano v1.15.1's own binaries (``make e2e-volcano``).

They run where ``TIDE_VOLCANO_BIN`` names a folder with ``vc-scheduler``,
``vc-controller-manager`` and ``vc-webhook-manager``, and skip with that reason otherwise (CI has
no Volcano binary: its Go module is not served). Each test gets a control plane of its own
(Volcano's components see every node and queue, so tests cannot share one), 4 KWOK nodes of 8
GPUs, and Volcano's three components with the scheduler configuration the test names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import require_control_plane_binaries
from tests.cluster.controlplane import ControlPlane
from tests.e2e_volcano.volcano import Volcano, volcano_bin


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.e2e_volcano)


StartVolcano = Callable[[str], tuple[ControlPlane, Volcano]]


@pytest.fixture
def start_volcano(tmp_path: Path) -> Iterator[StartVolcano]:
    """Starts a control plane and Volcano on it with the given scheduler configuration text;
    both stop at teardown, pass or fail."""
    folder, why = volcano_bin()
    if folder is None:
        pytest.skip(why)
    require_control_plane_binaries()
    started: list[tuple[ControlPlane, Volcano]] = []

    def start(scheduler_conf: str) -> tuple[ControlPlane, Volcano]:
        plane = ControlPlane.start(tmp_path / f"plane-{len(started)}")
        volcano = Volcano(
            plane, tmp_path / f"volcano-{len(started)}", scheduler_conf=scheduler_conf,
            bin_dir=folder,
        )  # fmt: skip
        started.append((plane, volcano))
        volcano.start()
        return plane, volcano

    try:
        yield start
    finally:
        for plane, volcano in reversed(started):
            try:
                volcano.stop()
            finally:
                plane.stop()
