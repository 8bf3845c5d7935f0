"""``--no-adaptive-batch``: a Pollux trace's jobs adapt their batch under tide unless it is given,
never under a baseline, and the report says which model each policy ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_profiles_option import app, layout, runner


@pytest.mark.parametrize(
    ("args", "models", "footer"),
    [
        ((), {"tide": "adaptive", "static": "submitted"}, True),
        (("--no-adaptive-batch",), {"tide": "submitted", "static": "submitted"}, False),
    ],
    ids=["tide-adapts-by-default", "no-adaptive-batch-keeps-the-submitted-batch"],
)
def test_the_report_says_which_batch_model_each_policy_ran(
    tmp_path: Path, args: tuple[str, ...], models: dict[str, str], footer: bool
) -> None:
    workload, profiles, cluster = layout(tmp_path)
    report = tmp_path / "r.json"
    result = runner.invoke(
        app,
        [
            "simulate",
            "--trace",
            str(workload),
            "--profiles",
            str(profiles),
            "--cluster",
            str(cluster),
            "--policies",
            "tide,static",
            "--no-bound",
            "--out",
            str(tmp_path / "out"),
            "--json",
            str(report),
            *args,
        ],
    )
    output = " ".join(result.output.split())
    assert result.exit_code == 0, output
    doc = json.loads(report.read_text())
    assert doc["meta"]["batch_model"] == models
    assert [s["batch_model"] for s in doc["summaries"]] == [models["tide"], models["static"]]
    assert doc["meta"]["run_options"]["adaptive_batch"] is (not args)
    assert ("batch: tide let the jobs that allow it choose their batch" in output) is footer
