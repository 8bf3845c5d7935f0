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
    # Every tide sample carries exactly the job and namespace labels (plus `le` on buckets).
    tide = [k for k in after if k[0].startswith("tide_worker_")]
    assert len(tide) > 20
    for name, labels in tide:
        assert dict(labels).keys() - {"le"} == LABELS.keys(), name
    # The server stops with the run and frees its port.
    with pytest.raises(urllib.error.URLError):
        scrape(port)
