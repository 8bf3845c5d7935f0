"""``tide forecast evaluate``: its JSON records, its table, its errors naming file and line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tide.cli import app

runner = CliRunner()
MODELS = {"tide", "persistence", "recent_peak", "persistence_residual", "seasonal_naive",
          "moving_average"}  # fmt: skip
HEADER = "time,running_job_num,running_gpu_num,pending_gpu_num"


def write_helios(path: Path, *, days: int = 3, seed: int = 0) -> Path:
    """A Helios-format queue: 8 GPUs, and jobs of 4 GPUs for an hour or so every few hours."""
    rng = np.random.default_rng(seed)
    minutes = days * 1440
    gpus = np.full(minutes, 8)
    t = 0
    while t < minutes:
        t += int(rng.integers(60, 300))
        gpus[t : t + int(rng.integers(30, 120))] += 4
    lines = [HEADER]
    for i, g in enumerate(gpus):
        day, minute = divmod(i, 1440)
        stamp = f"2020-05-{day + 1:02d} {minute // 60:02d}:{minute % 60:02d}:00"
        lines.append(f"{stamp},{g // 4},{g},0")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_json_records_are_exactly_the_documented_ones(tmp_path: Path) -> None:
    series = write_helios(tmp_path / "vcA" / "cluster_sequence_vc.csv")
    out = tmp_path / "scores.json"
    args = ["forecast", "evaluate", str(series), "--horizons", "600,1800", "--test-days", "1",
         "--json", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    records = json.loads(out.read_text())
    keys = {"metric", "value", "unit", "model", "target", "horizon_s", "quantile", "series"}
    assert all(set(r) == keys for r in records)
    assert len(records) == 3 * len(MODELS) * 2 * 2  # metrics × models × targets × horizons
    assert {r["model"] for r in records} == MODELS
    assert {(r["metric"], r["unit"]) for r in records} == {
        ("mae", "gpus"), ("pinball", "gpus"), ("coverage", "ratio")}  # fmt: skip
    assert {r["target"] for r in records} == {"peak", "point"}
    assert {r["horizon_s"] for r in records} == {600, 1800}
    assert {r["series"] for r in records} == {"vcA"} and {r["quantile"] for r in records} == {0.9}
    for r in records:
        assert isinstance(r["value"], float) and np.isfinite(r["value"]) and r["value"] >= 0
        if r["metric"] == "coverage":
            assert r["value"] <= 1
    assert "Rolling-origin forecast accuracy" in result.output


def test_a_tide_trace_gives_one_series_per_queue(tmp_path: Path) -> None:
    rows = ["job_id,submit_s,replicas,duration_s,queue,elastic"]
    rng = np.random.default_rng(3)
    for i in range(300):
        queue = "batch" if i % 2 else "dev"
        rows.append(f"ns/j{i},{i * 900 + int(rng.integers(0, 600))},{1 + i % 3},"
                    f"{int(rng.integers(600, 5400))},{queue},false")  # fmt: skip
    rows.append("ns/e,0,2,3600,dev,true")  # elastic: not headroom demand
    trace = tmp_path / "jobs.csv"
    trace.write_text("\n".join(rows) + "\n")
    out = tmp_path / "scores.json"
    args = ["forecast", "evaluate", str(trace), "--format", "tide", "--horizons", "1800",
         "--test-days", "1", "--json", str(out), "--plot", str(tmp_path / "f.png")]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert {r["series"] for r in json.loads(out.read_text())} == {"jobs/batch", "jobs/dev"}
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("2020-05-01 00:01:00,1,-2,0", "running_gpu_num must be a finite number >= 0"),
        ("yesterday,1,2,0", "does not match format"),
    ],
    ids=["negative-gpus", "bad-time"],
)
def test_a_bad_row_names_file_and_line(tmp_path: Path, row: str, message: str) -> None:
    series = tmp_path / "vcB" / "cluster_sequence_vc.csv"
    series.parent.mkdir()
    series.write_text(f"{HEADER}\n2020-05-01 00:00:00,1,2,0\n{row}\n")
    result = runner.invoke(app, ["forecast", "evaluate", str(series)])
    assert result.exit_code == 1
    assert f"{series}:3" in result.output and message in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--horizons", "600,soon"], "must be seconds separated by commas"),
        (["--quantile", "1.5"], "--quantile must be in (0, 1)"),
        (["--format", "excel"], "must be one of helios, tide"),
    ],
    ids=["horizons", "quantile", "format"],
)
def test_bad_options_are_refused(tmp_path: Path, args: list[str], message: str) -> None:
    series = write_helios(tmp_path / "vcC" / "cluster_sequence_vc.csv", days=2)
    result = runner.invoke(app, ["forecast", "evaluate", str(series), *args])
    assert result.exit_code == 2
    assert message in result.output


def test_a_series_too_short_for_the_test_window_is_an_error(tmp_path: Path) -> None:
    series = write_helios(tmp_path / "vcD" / "cluster_sequence_vc.csv", days=2)
    result = runner.invoke(app, ["forecast", "evaluate", str(series), "--test-days", "5"])
    assert result.exit_code == 1
    assert "vcD" in result.output and "at least one day of history" in result.output
