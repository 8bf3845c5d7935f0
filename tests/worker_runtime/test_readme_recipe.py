"""README.md's "Run it on one machine" recipe, run as written: two agents, SIGTERM to one.

The commands are read from the README itself; only the rendezvous port and the checkpoint
directory are replaced (by a free port and the test's directory), and ``torchrun`` by this
interpreter's ``-m torch.distributed.run`` (what the ``torchrun`` script runs).
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.worker_runtime.conftest import REPO, Cluster, wait_for

pytestmark = pytest.mark.torchrun

README = REPO / "README.md"
EXAMPLE = REPO / "manifests" / "examples" / "train_elastic.py"


@dataclass(frozen=True)
class Agent:
    env: dict[str, str]
    argv: list[str]
    background: bool


def recipe_block() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("### Run it on one machine", 1)[1]
    return section.split("```sh", 1)[1].split("```", 1)[0]


def recipe() -> tuple[list[Agent], list[str]]:
    """The agents' commands and the other commands of the recipe, comments dropped."""
    logical: list[str] = []
    pending = ""
    for line in recipe_block().splitlines():
        if not pending and line.lstrip().startswith("#"):
            continue
        pending += line.rstrip().removesuffix("\\") + " "
        if not line.rstrip().endswith("\\"):
            logical.append(" ".join(pending.split()))
            pending = ""
    agents, others = [], []
    for command in filter(None, logical):
        words = shlex.split(command)
        background = words[-1] == "&"
        words = words[:-1] if background else words
        env = {}
        while re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            name, value = words.pop(0).split("=", 1)
            env[name] = value
        if words[0] == "torchrun":
            agents.append(Agent(env, words[1:], background))
        else:
            others.append(command)
    return agents, others


def option(argv: list[str], name: str) -> str:
    """The value of ``--name=value`` or ``--name value`` in ``argv``."""
    for i, word in enumerate(argv):
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
        if word == name:
            return argv[i + 1]
    raise AssertionError(f"the README's command has no {name}: {argv}")


def localize(argv: list[str], *, port: int, ckpt: Path) -> list[str]:
    """``argv`` with the README's port and checkpoint directory replaced by the test's."""
    endpoint, ckpt_dir = option(argv, "--rdzv-endpoint"), option(argv, "--ckpt-dir")
    host = endpoint.rsplit(":", 1)[0]
    out = []
    for word in argv:
        word = word.replace(f"--rdzv-endpoint={endpoint}", f"--rdzv-endpoint={host}:{port}")
        out.append(str(ckpt) if word == ckpt_dir else word)
    return [sys.executable, "-m", "torch.distributed.run", *out]


def test_the_recipe_is_two_agents_of_one_job_and_a_sigterm() -> None:
    agents, others = recipe()
    assert len(agents) == 2, agents
    first, second = agents
    for agent in agents:
        assert agent.env == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        assert option(agent.argv, "--rdzv-backend") == "c10d"
        assert option(agent.argv, "--rdzv-endpoint").startswith("127.0.0.1:")
        assert int(option(agent.argv, "--max-restarts")) > 0
        assert "last_call_timeout=1" in option(agent.argv, "--rdzv-conf")
        assert "manifests/examples/train_elastic.py" in agent.argv
        # Two workers of local rank 0 on one machine: NCCL would put both on cuda:0.
        assert option(agent.argv, "--backend") == "gloo"
    # Apart from who hosts the store, the second agent runs the first one's command.
    assert first.argv == [w.replace("is_host=0", "is_host=1") for w in second.argv]
    assert "is_host=1" in option(first.argv, "--rdzv-conf")
    assert second.background and not first.background
    assert others == ["kill -TERM $!"]


def test_the_example_docstring_points_at_the_recipe() -> None:
    doc = EXAMPLE.read_text(encoding="utf-8").split('"""', 2)[1]
    assert "Run it on one machine" in doc
    assert "--max-restarts=100" in doc


def logged_world(log: Path) -> int | None:
    """The world size of the agent's latest worker start, from its log."""
    found = re.findall(r"(?:fresh start|resumed) .*?\bworld_size=(\d+)", log.read_text("utf-8"))
    return int(found[-1]) if found else None


def progress_step(ckpt: Path) -> int:
    try:
        return int(json.loads((ckpt / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


# Four torch processes start, one twice: on a loaded 2-core machine this can exceed the suite's
# default 300 s; every wait below is bounded on its own.
@pytest.mark.timeout(600)
def test_the_recipe_rescales_two_to_one_and_loses_no_step(cluster: Cluster) -> None:
    (first, second), _ = recipe()
    ckpt = cluster.ckpt_dir
    ckpt.mkdir(parents=True)
    epochs = int(option(first.argv, "--epochs"))
    host = cluster.start_command(localize(first.argv, port=cluster.port, ckpt=ckpt), env=first.env)
    joiner = cluster.start_command(
        localize(second.argv, port=cluster.port, ckpt=ckpt), env=second.env
    )
    first_log, second_log = cluster.agent_log(0), cluster.agent_log(1)
    wait_for(
        lambda: logged_world(first_log) == logged_world(second_log) == 2,
        timeout_s=180,
        what=f"both agents at world size 2\n{cluster.agent_logs()}",
    )
    at_two = progress_step(ckpt)
    wait_for(lambda: progress_step(ckpt) >= at_two + 5, timeout_s=60, what="5 steps at 2")
    joiner.send_signal(signal.SIGTERM)  # what the README's `kill -TERM $!` does
    cluster.wait_agent(joiner, timeout_s=90)
    assert cluster.wait_agent(host, timeout_s=240) == 0, cluster.agent_logs()

    host_log, joiner_log = first_log.read_text("utf-8"), second_log.read_text("utf-8")
    assert "SignalException" in joiner_log, joiner_log[-3000:]
    assert "ChildFailedError" not in host_log, host_log[-3000:]
    resumed = re.findall(r"resumed step=(\d+) .*\bworld_size=(\d+) .*\blost_steps=(\d+)", host_log)
    assert resumed, host_log[-3000:]
    saved_step, world, lost = map(int, resumed[-1])
    assert (world, lost) == (1, 0)
    steps_per_epoch = 4096 // 96
    assert at_two + 5 <= saved_step < epochs * steps_per_epoch
    last = epochs - 1
    assert f"epoch {last} done at step {epochs * steps_per_epoch}" in host_log, host_log[-3000:]
