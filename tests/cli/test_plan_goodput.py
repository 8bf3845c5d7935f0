"""``tide plan`` on an observation with an adaptive-batch job: its curve is its goodput."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scheduler_policy.adapters.observation_file import load_observation
from scheduler_policy.vocabulary.errors import ObservationError
from scheduler_policy.vocabulary.state import BatchBounds, StepTimes
from tide.cli import app

runner = CliRunner()

OBSERVATION = """
time: 1700000000
clusterFreeGpus: 8
queues:
  - {name: research, capabilityGpus: 16, deservedGpus: 16, allocatedGpus: 8}
jobs:
  - key: nlp/bert-adaptive
    queue: research
    currentReplicas: 4
    annotations: {tide.io/elastic: "true", tide.io/max-replicas: "12"}
    throughput:
      - {time: 1699990000, replicas: 2, samplesPerS: 900}
      - {time: 1699998000, replicas: 4, samplesPerS: 1500}
    batchBounds: {initialBatchSize: 64, maxBatchSize: 4096, localBatchMin: 8,
                  localBatchMax: 256, accumulation: true}
    batchStatistics:
      batchSize: 128
      gradSqr: 1.0
      gradVar: 50.0
      progress: 100
      plannedProgress: 100000
      stepTimes:
        - {nodes: 1, replicas: 2, localBatchSize: 32, optimStepS: 0.0623,
           accumulationStepS: 0.042, syncS: 0.02}
        - {nodes: 1, replicas: 4, localBatchSize: 32, optimStepS: 0.0671,
           accumulationStepS: 0.042, syncS: 0.024}
  - key: vision/resnet
    queue: research
    currentReplicas: 4
    remainingSamples: 2000000
    annotations: {tide.io/elastic: "true", tide.io/max-replicas: "12"}
    throughput:
      - {time: 1699990000, replicas: 2, samplesPerS: 900}
      - {time: 1699998000, replicas: 4, samplesPerS: 1500}
"""


def write(tmp_path: Path, text: str = OBSERVATION) -> Path:
    path = tmp_path / "observation.yaml"
    path.write_text(text)
    return path


def test_plan_shows_a_goodput_decision(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", "--json", "--observation", str(write(tmp_path))])
    assert result.exit_code == 0, result.output
    decisions = {d["job"]: d for d in json.loads(result.output)["decisions"]}
    adaptive, plain = decisions["nlp/bert-adaptive"], decisions["vision/resnet"]
    assert (
        "goodput curve: progress per second at the batch its workers would take"
        in (adaptive["message"])
    )
    assert "goodput" not in plain["message"]


def test_the_file_reads_bounds_and_statistics(tmp_path: Path) -> None:
    job = load_observation(write(tmp_path)).jobs[0]
    assert job.batch_bounds == BatchBounds(
        initial_batch_size=64, max_batch_size=4096, local_batch_min=8, local_batch_max=256,
        accumulation=True,
    )  # fmt: skip
    assert job.batch_statistics is not None
    assert job.batch_statistics.planned_progress == 100000
    assert job.batch_statistics.step_times[1] == StepTimes(
        nodes=1, replicas=4, local_batch_size=32, optim_step_s=0.0671,
        accumulation_step_s=0.042, sync_s=0.024,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("maxBatchSize: 4096", "maxBatchSize: 32",
         "jobs[0].batchBounds.maxBatchSize: must be at least initialBatchSize (64), got 32"),
        ("localBatchMin: 8,", "localBatchMin: 0,",
         "jobs[0].batchBounds.localBatchMin: must be an integer >= 1, got 0"),
        ("optimStepS: 0.0623", "optimStepS: -1",
         "jobs[0].batchStatistics.stepTimes[0].optimStepS: must be a positive number of "
         "seconds, got -1"),
        ("gradSqr: 1.0", "gradSqr: .nan",
         "jobs[0].batchStatistics.gradSqr: must be a finite number, got nan"),
        ("      batchSize: 128\n", "",
         "jobs[0].batchStatistics.batchSize: is required"),
    ],
    ids=["max-below-initial", "zero-micro-batch", "negative-step", "nan-grad-sqr",
         "no-batch-size"],
)  # fmt: skip
def test_bad_bounds_or_statistics_are_named(tmp_path: Path, old, new, problem) -> None:
    assert old in OBSERVATION
    with pytest.raises(ObservationError) as e:
        load_observation(write(tmp_path, OBSERVATION.replace(old, new)))
    assert problem in str(e.value)
