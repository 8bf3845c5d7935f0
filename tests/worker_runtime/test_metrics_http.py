"""The metrics server of local rank 0, scraped over HTTP on loopback like Prometheus would."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from tests.worker_runtime.conftest import free_port
from tests.worker_runtime.test_run_local import ENV, LABELS, train
from worker_runtime import ElasticRun


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample served on ``port``, keyed by name and sorted labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def key(name: str, **extra: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted((LABELS | extra).items()))


def test_local_rank_0_serves_labelled_metrics_until_the_run_ends(tmp_path: Path) -> None:
    port = free_port()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    run = ElasticRun(
        checkpoint_dir=tmp_path,
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        micro_batch_size=2,
        global_batch_size=4,
        checkpoint_every_steps=2,
        registry=CollectorRegistry(),
        environ=ENV | {"TIDE_METRICS_PORT": str(port)},
        metrics_addr="127.0.0.1",
    )
    with run:
        before = scrape(port)
        train(run, [])  # 5 steps of 4 samples; saves at steps 2, 4 and 5 (end)
        run.checkpointer.wait()
        after = scrape(port)

    assert before[key("tide_worker_samples_total")] == 0
    assert before[key("tide_worker_world_size")] == 1
    assert before[key("tide_worker_consumed_samples")] == 0
    # No plan before the script has declared its epochs and dataset.
    assert key("tide_worker_planned_samples") not in before
    assert after[key("tide_worker_samples_total")] == 20
    assert after[key("tide_worker_steps_total")] == 5
    assert after[key("tide_worker_world_size")] == 1
    assert after[key("tide_worker_restarts_total")] == 0
    assert after[key("tide_worker_step_seconds_count")] == 5
    assert after[key("tide_worker_step_seconds_bucket", le="+Inf")] == 5
    assert after[key("tide_worker_checkpoint_blocked_seconds_count")] == 3
    assert after[key("tide_worker_checkpoint_save_seconds_count")] == 3
    assert key("tide_worker_checkpoint_load_seconds") in after
    assert key("tide_worker_checkpoint_write_overlap_steps") in after
    # One epoch of 20 samples in global batches of 4: 20 planned, 20 consumed.
    assert after[key("tide_worker_planned_samples")] == 20
    assert after[key("tide_worker_consumed_samples")] == 20
    # Every tide sample carries exactly the job, namespace and pod labels (plus `le` on buckets).
    tide = [k for k in after if k[0].startswith("tide_worker_")]
    assert len(tide) > 20
    for name, labels in tide:
        assert dict(labels).keys() - {"le"} == LABELS.keys(), name
    # The server stops with the run and frees its port.
    with pytest.raises(urllib.error.URLError):
        scrape(port)


@pytest.mark.parametrize(
    ("epochs", "dataset", "global_batch", "planned"),
    [(1, 20, 4, 20.0), (3, 22, 4, 60.0), (2, 3, 4, 0.0)],
    ids=["whole-batches", "last-partial-batch-dropped", "dataset-smaller-than-a-batch"],
)
def test_planned_samples_are_the_whole_steps_of_every_epoch(
    tmp_path: Path, epochs: int, dataset: int, global_batch: int, planned: float
) -> None:
    registry = CollectorRegistry()
    model = torch.nn.Linear(4, 1)
    run = ElasticRun(
        checkpoint_dir=tmp_path,
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        micro_batch_size=global_batch,
        global_batch_size=global_batch,
        checkpoint_every_steps=None,
        registry=registry,
        environ=ENV,
    )
    with run:
        assert registry.get_sample_value("tide_worker_planned_samples", LABELS) is None
        run.make_sampler(range(dataset))
        # The dataset alone is no plan; the epochs complete it.
        assert registry.get_sample_value("tide_worker_planned_samples", LABELS) is None
        epochs_iter = run.epochs(epochs)
        next(epochs_iter)
        assert registry.get_sample_value("tide_worker_planned_samples", LABELS) == planned
        epochs_iter.close()


def test_a_pod_without_pod_name_labels_its_metrics_with_an_empty_pod(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    model = torch.nn.Linear(4, 1)
    env = {k: v for k, v in ENV.items() if k != "POD_NAME"}
    run = ElasticRun(
        checkpoint_dir=tmp_path,
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        micro_batch_size=2,
        global_batch_size=2,
        registry=registry,
        environ=env,
    )
    with run:
        labels = LABELS | {"pod": ""}
        assert registry.get_sample_value("tide_worker_world_size", labels) == 1
        assert registry.get_sample_value("tide_worker_nodes", labels) == 1  # one agent
