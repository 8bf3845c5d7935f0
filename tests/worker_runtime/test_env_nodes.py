"""The nodes a torchrun membership spans: GROUP_WORLD_SIZE, the agents."""

from __future__ import annotations

import pytest

from worker_runtime.env import WorkerEnv
from worker_runtime.errors import ConfigError

CASES = {
    "torchrun-sets-it": ({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "2"}, 2),
    "derived-from-local-world-size": ({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "2"}, 4),
    "single-process": ({}, 1),
}


@pytest.mark.parametrize(("environ", "nodes"), CASES.values(), ids=CASES)
def test_group_world_size(environ: dict[str, str], nodes: int) -> None:
    assert WorkerEnv.from_environ(environ).group_world_size == nodes


def test_a_bad_group_world_size_is_named() -> None:
    with pytest.raises(ConfigError, match="GROUP_WORLD_SIZE"):
        WorkerEnv.from_environ({"GROUP_WORLD_SIZE": "0"})
