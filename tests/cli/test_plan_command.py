"""``tide plan``: reasons and messages whole at any width and in a file; JSON carries more."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scheduler_policy.adapters.observation_file import (
    example_observation_path,
    example_policy_path,
    load_observation,
)
from scheduler_policy.policy.file import load_policy
from tide.cli import app, plan_observation

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def expected_decisions() -> list[tuple[str, str, str]]:
    plan = plan_observation(
        observation=load_observation(example_observation_path()),
        policy=load_policy(example_policy_path()),
    )
    assert plan.decisions  # the example has something to show
    return [(d.job, d.reason.value, d.message) for d in plan.decisions]


@pytest.mark.parametrize("columns", ["60", "80", "200"], ids=["60-columns", "80", "wide"])
def test_every_reason_and_message_is_whole_at_any_width(columns: str) -> None:
    result = runner.invoke(app, ["plan"], env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= int(columns)
    text = " ".join(result.output.split())
    for job, reason, message in expected_decisions():
        assert any(line.split()[:1] == [job] and reason in line.split() for line in lines)
        assert " ".join(message.split()) in text, message
    assert "…" not in result.output


def test_a_plan_redirected_to_a_file_loses_no_word(tmp_path: Path) -> None:
    target = tmp_path / "plan.txt"
    with target.open("w") as f:  # not a terminal: rich's 80 columns
        subprocess.run(
            [sys.executable, "-m", "tide", "plan"], stdout=f, check=True, cwd=ROOT, env={
                "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"
            },
        )  # fmt: skip
    text = target.read_text()
    words = " ".join(text.split())
    for _, reason, message in expected_decisions():
        assert reason in text.split()
        assert " ".join(message.split()) in words
    assert "…" not in text


def test_plan_json_carries_the_queues_budgets_headroom_and_forecast() -> None:
    result = runner.invoke(app, ["plan", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [(d["job"], d["reason"], d["message"]) for d in doc["decisions"]] == (
        expected_decisions()
    )
    policy = load_policy(example_policy_path())
    observed = {q.name for q in load_observation(example_observation_path()).queues}
    managed = [q.name for q in policy.queues if q.name in observed]
    assert [q["queue"] for q in doc["queues"]] == managed
    for queue in doc["queues"]:
        assert 0 <= queue["elastic_budget_gpus"] <= queue["limit_gpus"]
        assert queue["headroom_gpus"] >= queue["headroom"]["fixed_gpus"]
        assert set(queue["headroom"]) == {
            "fixed_gpus", "forecast_gpus", "forecast_quantile", "forecast_horizon_s",
            "forecast_reason",
        }  # fmt: skip
        assert queue["headroom"]["forecast_gpus"] >= 0
