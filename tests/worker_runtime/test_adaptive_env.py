"""The adaptive-batch settings the worker reads, and their agreement with ``tide validate``."""

from __future__ import annotations

import pytest

from scheduler_policy.policy.annotations import ADAPTIVE_ENV, job_overrides
from scheduler_policy.vocabulary.errors import PolicyError
from worker_runtime.env import ADAPTIVE_ENVS, AdaptiveBatchSettings, WorkerEnv
from worker_runtime.errors import ConfigError

BASE = {
    "TIDE_ADAPTIVE_BATCH": "true",
    "TIDE_INITIAL_BATCH_SIZE": "32",
    "TIDE_MAX_BATCH_SIZE": "512",
    "TIDE_LOCAL_BATCH_MAX": "64",
}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"TIDE_ADAPTIVE_BATCH": ""}, None),
        ({"TIDE_ADAPTIVE_BATCH": "false"}, None),
        (BASE, AdaptiveBatchSettings(32, 512, 1, 64, False)),
        (
            BASE | {"TIDE_LOCAL_BATCH_MIN": "8", "TIDE_ACCUMULATION": "true"},
            AdaptiveBatchSettings(32, 512, 8, 64, True),
        ),
    ],
    ids=["unset", "empty", "false", "required-only", "all-set"],
)
def test_settings_read(env: dict[str, str], expected: AdaptiveBatchSettings | None) -> None:
    assert WorkerEnv.from_environ(env).adaptive == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TIDE_ADAPTIVE_BATCH": "yes"},
         "TIDE_ADAPTIVE_BATCH: must be \"true\" or \"false\", got 'yes'"),
        ({"TIDE_ADAPTIVE_BATCH": "true"},
         "TIDE_INITIAL_BATCH_SIZE: required with TIDE_ADAPTIVE_BATCH=true"),
        ({"TIDE_MAX_BATCH_SIZE": "8"},
         "TIDE_MAX_BATCH_SIZE: set without TIDE_ADAPTIVE_BATCH=true"),
        (BASE | {"TIDE_INITIAL_BATCH_SIZE": "x"},
         "TIDE_INITIAL_BATCH_SIZE: must be an integer, got 'x'"),
        (BASE | {"TIDE_MAX_BATCH_SIZE": "16"},
         "TIDE_MAX_BATCH_SIZE: must be >= TIDE_INITIAL_BATCH_SIZE (32), got 16"),
        (BASE | {"TIDE_LOCAL_BATCH_MIN": "128"},
         "TIDE_LOCAL_BATCH_MAX: must be >= TIDE_LOCAL_BATCH_MIN (128), got 64"),
        (BASE | {"TIDE_ACCUMULATION": "1"},
         "TIDE_ACCUMULATION: must be \"true\" or \"false\", got '1'"),
    ],
    ids=["flag-yes", "bound-missing", "bound-without-flag", "not-int", "max-below-initial",
         "local-max-below-min", "accumulation-one"],
)  # fmt: skip
def test_settings_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        WorkerEnv.from_environ(env)
    assert message in str(excinfo.value)


def test_env_names_are_the_annotations_names() -> None:
    assert tuple(ADAPTIVE_ENV.values()) == ADAPTIVE_ENVS


ANNOTATIONS = {
    "tide.io/adaptive-batch": "true",
    "tide.io/initial-batch-size": "32",
    "tide.io/max-batch-size": "512",
    "tide.io/local-batch-max": "64",
}
AGREEMENT = {
    "valid": ANNOTATIONS,
    "valid-all": ANNOTATIONS | {"tide.io/local-batch-min": "8", "tide.io/accumulation": "true"},
    "opted-out": {"tide.io/adaptive-batch": "false"},
    "bound-without-flag": {"tide.io/local-batch-max": "64"},
    "flag-only": {"tide.io/adaptive-batch": "true"},
    "zero-initial": ANNOTATIONS | {"tide.io/initial-batch-size": "0"},
    "max-below-initial": ANNOTATIONS | {"tide.io/max-batch-size": "16"},
    "local-inverted": ANNOTATIONS | {"tide.io/local-batch-min": "65"},
    "local-min-above-max": ANNOTATIONS
    | {"tide.io/local-batch-min": "600", "tide.io/local-batch-max": "600"},
    "bad-flag": ANNOTATIONS | {"tide.io/accumulation": "on"},
}


@pytest.mark.parametrize("name", list(AGREEMENT))
def test_the_worker_accepts_exactly_what_tide_validate_accepts(name: str) -> None:
    annotations = AGREEMENT[name]
    env = {ADAPTIVE_ENV[k]: v for k, v in annotations.items()}
    try:
        read = job_overrides(annotations, source="ml/job").adaptive_batch
    except PolicyError:
        with pytest.raises(ConfigError):
            WorkerEnv.from_environ(env)
        return
    worker = WorkerEnv.from_environ(env).adaptive
    if read is None:
        assert worker is None
    else:
        assert worker == AdaptiveBatchSettings(
            read.initial_batch_size,
            read.max_batch_size,
            read.local_batch_min,
            read.local_batch_max,
            read.accumulation,
        )
