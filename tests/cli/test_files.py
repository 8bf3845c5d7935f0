"""The files a user writes share one convention (camelCase keys, duration strings, did-you-mean,
no key given twice), and the shipped examples do what they say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from scheduler_policy.adapters.observation_file import load_observation
from scheduler_policy.policy.fields import format_duration, parse_duration
from scheduler_policy.policy.file import load_policy
from scheduler_policy.vocabulary.errors import TideError
from simulations.api import default_policy_for
from simulations.cluster_config import BUILTIN_CLUSTER, load_cluster
from simulations.errors import SimulationError
from simulations.tune_space import load_search_space
from tide import sim_commands

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
app = typer.Typer()
sim_commands.register(app)
runner = CliRunner()


def test_default_yaml_is_the_built_in_default_policy() -> None:
    assert load_policy(MANIFESTS / "policies" / "default.yaml") == default_policy_for(
        BUILTIN_CLUSTER
    )


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0, "0s"), (0.5, "500ms"), (30.0, "30s"), (300.0, "5m"), (5400.0, "1h30m"),
     (90.5, "1m30s500ms"), (86400.0, "24h"), (1234567.0, "342h56m7s"), (37.1234567, "37.1234567s")],
    ids=["zero", "millis", "seconds", "minutes", "hours-minutes", "mixed", "a-day", "large",
         "not-whole-millis"],
)  # fmt: skip
def test_durations_are_written_as_people_write_them_and_read_back(
    seconds: float, text: str
) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text, path="x") == seconds


POLICY = "apiVersion: tide.io/v1alpha1\nkind: ElasticPolicy\nmetadata: {name: p}\n"
CLUSTER = "kind: Cluster\nnodes: 2\ngpusPerNode: 4\nqueues: [{name: a}]\n"
SPACE = "kind: SearchSpace\nparameters:\n  defaults.cooldown: [1m]\n"
OBSERVATION = "time: 0\nqueues: []\njobs: []\n"


def _load(kind: str, path: Path) -> object:
    loaders = {
        "policy": load_policy,
        "cluster": load_cluster,
        "space": load_search_space,
        "observation": load_observation,
    }
    return loaders[kind](path)


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        ("policy", POLICY + "spec:\n  interval: 60s\n  interval: 30s\n",
         "line 6, column 3: invalid YAML: key 'interval' is given twice (first on line 5)"),
        ("cluster", CLUSTER + "nodes: 3\n",
         "line 5, column 1: invalid YAML: key 'nodes' is given twice (first on line 2)"),
        ("space", SPACE + "  defaults.cooldown: [2m]\n",
         "key 'defaults.cooldown' is given twice (first on line 3)"),
        ("observation", OBSERVATION + "time: 5\n",
         "key 'time' is given twice (first on line 1)"),
        ("policy", POLICY.replace("ElasticPolicy", "Elasticpolicy"),
         "kind: must be 'ElasticPolicy', got 'Elasticpolicy'; did you mean 'ElasticPolicy'?"),
        ("space", SPACE.replace("SearchSpace", "searchspace"),
         "kind: must be 'SearchSpace', got 'searchspace'; did you mean 'SearchSpace'?"),
        ("space", SPACE + "trails: 3\n", "trails: unknown key; did you mean 'trials'?"),
        ("policy", POLICY + "spec:\n  queues: [{name: a, headroom: {gpus: 1.5}}]\n",
         "spec.queues[0].headroom.gpus: must be a whole number of GPUs, got 1.5"),
        ("policy", POLICY + "spec:\n  queues: [{name: a, maxElasticGpus: 2.5}]\n",
         "spec.queues[0].maxElasticGpus: must be a whole number of GPUs, got 2.5"),
        ("policy", POLICY + "spec:\n  queues: [{name: a, elastic: 1}]\n",
         "spec.queues[0].elastic: must be true or false, got 1"),
        ("policy", POLICY + "spec:\n  queues: [{name: a, elastic: null}]\n",
         "spec.queues[0].elastic: must be true or false, got null"),
    ],
    ids=["policy-key-twice", "cluster-key-twice", "space-key-twice", "observation-key-twice",
         "policy-kind-case", "space-kind-case", "space-typo", "fractional-headroom",
         "fractional-cap", "number-for-bool", "null-in-yaml-words"],
)  # fmt: skip
def test_every_file_tide_reads_says_what_is_wrong_and_where(
    tmp_path: Path, kind: str, text: str, message: str
) -> None:
    path = tmp_path / f"{kind}.yaml"
    path.write_text(text)
    with pytest.raises((TideError, SimulationError)) as refused:
        _load(kind, path)
    assert message in str(refused.value)
    assert str(path) in str(refused.value)
    assert "True" not in str(refused.value) and "None" not in str(refused.value)


POLICIES = sorted((MANIFESTS / "policies").glob("*.yaml"))


@pytest.mark.parametrize("policy", POLICIES, ids=[p.name for p in POLICIES])
def test_every_example_policy_scales_jobs_on_the_shipped_cluster(
    tmp_path: Path, policy: Path
) -> None:
    # default.yaml once managed a queue `default` without borrowing: it scaled nothing on the
    # built-in cluster, and compare showed it equal to static.
    result = runner.invoke(
        app,
        [
            *(
                "compare",
                str(policy),
                "--cluster",
                str(MANIFESTS / "clusters" / "small-mixed.yaml"),
            ),
            *("--duration", "3", "--no-bound", "--out", str(tmp_path / "o")),
            *("--json", str(tmp_path / "r.json")),
        ],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output
    (summary,) = json.loads((tmp_path / "r.json").read_text())["summaries"]
    assert summary["rescales"] > 0


OBSERVED = (
    "time: 1000\nclusterGpus: 16\nclusterFreeGpus: 4\n"
    "queues: [{name: q, allocatedGpus: 8}]\n"
    "jobs:\n  - {key: ns/a, queue: q, currentReplicas: 2, elastic: true, gpusPerReplica: 1,\n"
    "     throughput: [{time: 900, replicas: 2, samplesPerS: 10}]}\n"
)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("gpusPerReplica: 1", "gpusPerReplica: 0"), "jobs[0].gpusPerReplica: must be > 0, got 0"),
        (("time: 1000\n", ""), "time: is required (the decision time, seconds since the epoch)"),
        (("{time: 900, ", "{"),
         "jobs[0].throughput[0].time: is required (when the sample was taken, seconds)"),
        (("{time: 900,", "{time: 1100,"),
         "jobs[0].throughput[0].time: 1100 is after the observation's time 1000 (a sample "
         "from the future)"),
        (("clusterFreeGpus: 4", "clusterFreeGpus: 20"),
         "clusterFreeGpus: 20 is above the cluster's 16 GPUs (clusterGpus)"),
        (("clusterFreeGpus: 4", "clusterFreeGpus: 10"),
         "clusterFreeGpus: 10 free and 8 allocated to queues add up to more than the cluster's "
         "16 GPUs (clusterGpus)"),
    ],
    ids=["zero-gpus-per-replica", "no-time", "sample-without-time", "sample-from-the-future",
         "free-above-total", "free-and-allocated-above-total"],
)  # fmt: skip
def test_an_observation_refuses_values_it_once_accepted(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    path = tmp_path / "obs.yaml"
    path.write_text(OBSERVED)
    assert load_observation(path).time_s == 1000.0  # the unchanged file is fine
    path.write_text(OBSERVED.replace(*change))
    with pytest.raises(TideError) as refused:
        load_observation(path)
    assert f"  - {message}" in str(refused.value).splitlines()


@pytest.mark.parametrize(
    ("point", "nodes"),
    [("{time: 900, replicas: 2, samplesPerS: 10}", None),
     ("{time: 900, replicas: 8, samplesPerS: 10, nodes: 2}", 2)],
    ids=["nodes-unknown", "nodes-given"],
)  # fmt: skip
def test_a_throughput_point_may_say_its_nodes(
    tmp_path: Path, point: str, nodes: int | None
) -> None:
    path = tmp_path / "obs.yaml"
    path.write_text(OBSERVED.replace("{time: 900, replicas: 2, samplesPerS: 10}", point))
    (job,) = load_observation(path).jobs
    assert job.throughput_history[0].nodes == nodes


def test_a_throughput_point_refuses_zero_nodes(tmp_path: Path) -> None:
    path = tmp_path / "obs.yaml"
    path.write_text(OBSERVED.replace("samplesPerS: 10}", "samplesPerS: 10, nodes: 0}"))
    with pytest.raises(TideError) as refused:
        load_observation(path)
    expected = "  - jobs[0].throughput[0].nodes: must be an integer >= 1 (nodes spanned), got 0"
    assert expected in str(refused.value).splitlines()
