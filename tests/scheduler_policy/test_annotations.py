"""Tests for per-job overrides read from a Volcano Job's tide.io/* annotations."""

from __future__ import annotations

import pytest

from scheduler_policy.policy.annotations import (
    ADAPTIVE_ENV,
    JobOverrides,
    job_overrides,
)
from scheduler_policy.vocabulary.errors import PolicyError
from scheduler_policy.vocabulary.state import BatchBounds


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({}, JobOverrides()),
        ({"tide.io/elastic": "true"}, JobOverrides(elastic=True)),
        ({"tide.io/elastic": "false"}, JobOverrides(elastic=False)),
        (
            {
                "tide.io/elastic": "true",
                "tide.io/task": "trainer",
                "tide.io/min-replicas": "2",
                "tide.io/max-replicas": "16",
                "tide.io/restart-cost": "1m30s",
            },
            JobOverrides(
                elastic=True, task="trainer", min_replicas=2, max_replicas=16, restart_cost_s=90.0
            ),
        ),
        ({"tide.io/min-replicas": "0", "tide.io/max-replicas": "0"},
         JobOverrides(min_replicas=0, max_replicas=0)),
        ({"tide.io/min-replicas": "4", "tide.io/max-replicas": "4"},
         JobOverrides(min_replicas=4, max_replicas=4)),
        ({"tide.io/max-replicas": "8"}, JobOverrides(max_replicas=8)),
        ({"volcano.sh/preemptable": "false", "example.com/tide.io/x": "y", "tide.io": "z"},
         JobOverrides()),
    ],
    ids=["none", "elastic-true", "elastic-false", "all-set", "zero-bounds", "equal-bounds",
         "max-only", "foreign-annotations-ignored"],
)  # fmt: skip
def test_job_overrides_reads(annotations: dict[str, str], expected: JobOverrides) -> None:
    assert job_overrides(annotations, source="ml/bert") == expected


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({"tide.io/elastic": "yes"},
         'metadata.annotations["tide.io/elastic"]: must be "true" or "false", got \'yes\''),
        ({"tide.io/elastic": "True"},
         'metadata.annotations["tide.io/elastic"]: must be "true" or "false", got \'True\''),
        ({"tide.io/task": " "},
         'metadata.annotations["tide.io/task"]: must name a task, got \' \''),
        ({"tide.io/min-replicas": "two"},
         'metadata.annotations["tide.io/min-replicas"]: must be a non-negative integer, '
         "got 'two'"),
        ({"tide.io/min-replicas": "-1"},
         'metadata.annotations["tide.io/min-replicas"]: must be a non-negative integer, '
         "got '-1'"),
        ({"tide.io/max-replicas": "2.5"},
         'metadata.annotations["tide.io/max-replicas"]: must be a non-negative integer, '
         "got '2.5'"),
        ({"tide.io/max-replicas": ""},
         'metadata.annotations["tide.io/max-replicas"]: must be a non-negative integer, got \'\''),
        ({"tide.io/min-replicas": "8", "tide.io/max-replicas": "4"},
         'metadata.annotations["tide.io/min-replicas"]: must not exceed tide.io/max-replicas (4), '
         "got '8'"),
        ({"tide.io/restart-cost": "30"},
         'metadata.annotations["tide.io/restart-cost"]: must be a duration such as \'30s\', '
         "'5m', '1h30m' or '500ms', got '30'"),
        ({"tide.io/restart-cost": "-30s"},
         'metadata.annotations["tide.io/restart-cost"]: must not be negative, got \'-30s\''),
        ({"tide.io/min-replica": "2"},
         'metadata.annotations["tide.io/min-replica"]: unknown tide.io annotation; '
         "did you mean 'tide.io/min-replicas'?"),
        ({"tide.io/restartcost": "30s"},
         'metadata.annotations["tide.io/restartcost"]: unknown tide.io annotation; '
         "did you mean 'tide.io/restart-cost'?"),
        ({"tide.io/zzzzzz": "1"},
         'metadata.annotations["tide.io/zzzzzz"]: unknown tide.io annotation; expected one of '
         "tide.io/elastic, tide.io/task, tide.io/min-replicas, tide.io/max-replicas, "
         "tide.io/restart-cost, tide.io/adaptive-batch, tide.io/initial-batch-size, "
         "tide.io/max-batch-size, tide.io/local-batch-min, tide.io/local-batch-max, "
         "tide.io/accumulation"),
    ],
    ids=["elastic-yes", "elastic-capitalised", "task-blank", "min-word", "min-negative",
         "max-fraction", "max-empty", "min-above-max", "restart-cost-bare-number",
         "restart-cost-negative", "unknown-singular", "unknown-no-hyphen", "unknown-no-suggestion"],
)  # fmt: skip
def test_job_overrides_refuses(annotations: dict[str, str], message: str) -> None:
    with pytest.raises(PolicyError) as excinfo:
        job_overrides(annotations, source="ml/bert")
    assert excinfo.value.source == "ml/bert"
    assert excinfo.value.problems == [message]


def test_job_overrides_reports_every_problem_at_once() -> None:
    annotations = {
        "tide.io/elastic": "on",
        "tide.io/max-replica": "8",
        "tide.io/min-replicas": "two",
        "tide.io/restart-cost": "soon",
    }
    with pytest.raises(PolicyError) as excinfo:
        job_overrides(annotations, source="ml/bert")
    assert excinfo.value.problems == [
        'metadata.annotations["tide.io/max-replica"]: unknown tide.io annotation; '
        "did you mean 'tide.io/max-replicas'?",
        'metadata.annotations["tide.io/elastic"]: must be "true" or "false", got \'on\'',
        "metadata.annotations[\"tide.io/min-replicas\"]: must be a non-negative integer, got 'two'",
        "metadata.annotations[\"tide.io/restart-cost\"]: must be a duration such as '30s', "
        "'5m', '1h30m' or '500ms', got 'soon'",
    ]


ADAPTIVE = {
    "tide.io/adaptive-batch": "true",
    "tide.io/initial-batch-size": "256",
    "tide.io/max-batch-size": "4096",
    "tide.io/local-batch-max": "128",
}


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        (ADAPTIVE, BatchBounds(256, 4096, 1, 128, False)),
        (ADAPTIVE | {"tide.io/local-batch-min": "32", "tide.io/accumulation": "true"},
         BatchBounds(256, 4096, 32, 128, True)),
        ({"tide.io/adaptive-batch": "false"}, None),
        ({}, None),
    ],
    ids=["required-only", "all-set", "opted-out", "absent"],
)  # fmt: skip
def test_adaptive_batch_annotations_read(
    annotations: dict[str, str], expected: BatchBounds | None
) -> None:
    assert job_overrides(annotations, source="ml/bert").adaptive_batch == expected


def path(key: str) -> str:
    return f'metadata.annotations["tide.io/{key}"]'


@pytest.mark.parametrize(
    ("annotations", "messages"),
    [
        (ADAPTIVE | {"tide.io/adaptive-batch": "yes"},
         [f"{path('adaptive-batch')}: must be \"true\" or \"false\", got 'yes'"]),
        ({"tide.io/adaptive-batch": "true"},
         [f'{path(k)}: required with tide.io/adaptive-batch: "true"'
          for k in ("initial-batch-size", "max-batch-size", "local-batch-max")]),
        ({"tide.io/max-batch-size": "64"},
         [f'{path("max-batch-size")}: set without tide.io/adaptive-batch: "true", so it would '
          "do nothing"]),
        ({"tide.io/adaptive-batch": "false", "tide.io/accumulation": "true"},
         [f'{path("accumulation")}: set without tide.io/adaptive-batch: "true", so it would '
          "do nothing"]),
        (ADAPTIVE | {"tide.io/initial-batch-size": "0"},
         [f"{path('initial-batch-size')}: must be at least 1, got '0'"]),
        (ADAPTIVE | {"tide.io/local-batch-max": "big"},
         [f"{path('local-batch-max')}: must be a non-negative integer, got 'big'"]),
        (ADAPTIVE | {"tide.io/accumulation": "1"},
         [f"{path('accumulation')}: must be \"true\" or \"false\", got '1'"]),
        (ADAPTIVE | {"tide.io/max-batch-size": "128"},
         [f"{path('max-batch-size')}: must be at least tide.io/initial-batch-size (256), "
          "got '128'"]),
        (ADAPTIVE | {"tide.io/local-batch-min": "256"},
         [f"{path('local-batch-max')}: must be at least tide.io/local-batch-min (256), "
          "got '128'"]),
        (ADAPTIVE | {"tide.io/local-batch-min": "8192", "tide.io/local-batch-max": "8192"},
         [f"{path('local-batch-min')}: must not exceed tide.io/max-batch-size (4096), "
          "got '8192'"]),
        (ADAPTIVE | {"tide.io/adaptive-batchs": "true"},
         [f"{path('adaptive-batchs')}: unknown tide.io annotation; "
          "did you mean 'tide.io/adaptive-batch'?"]),
    ],
    ids=["flag-yes", "bounds-missing", "bound-without-flag", "bound-with-flag-false",
         "initial-zero", "local-max-word", "accumulation-one", "max-below-initial",
         "local-max-below-min", "local-min-above-max-batch", "misspelt"],
)  # fmt: skip
def test_adaptive_batch_annotations_refused(
    annotations: dict[str, str], messages: list[str]
) -> None:
    with pytest.raises(PolicyError) as excinfo:
        job_overrides(annotations, source="ml/bert")
    assert excinfo.value.problems == messages


def test_adaptive_env_names_follow_the_annotations() -> None:
    assert ADAPTIVE_ENV["tide.io/adaptive-batch"] == "TIDE_ADAPTIVE_BATCH"
    assert ADAPTIVE_ENV["tide.io/initial-batch-size"] == "TIDE_INITIAL_BATCH_SIZE"
    assert len(set(ADAPTIVE_ENV.values())) == 6
