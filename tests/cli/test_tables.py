"""The comparison tables on terminals narrower than they are: split, never cropped."""

from __future__ import annotations

import dataclasses
import io

import pytest
from rich.console import Console

from simulations.report import Summary
from tide.comparison import print_fitted, seeds_table, summary_table

POLICIES = ("tide", "static", "threshold", "hpa", "optimus", "tiresias")


def _summary(policy: str, seed: int = 0) -> Summary:
    numbers = {f.name: 1.25 + seed for f in dataclasses.fields(Summary)}
    return Summary(
        **numbers
        | {"policy": policy, "workload": "w", "queue_delay_by_queue_h": {}, "jobs": 40}
        | {"finished": 40, "rescales": 12, "kills": 0, "skipped_rows": 0}
    )


def _printed(table_of: str, width: int, policies: tuple[str, ...] = POLICIES) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width)
    if table_of == "summary":
        table = summary_table([_summary(p) for p in policies], title="the title")
    else:
        table = seeds_table([_summary(p, s) for s in (0, 1) for p in policies], title="the title")
    print_fitted(console, table)
    return out.getvalue()


def _parts(text: str) -> int:
    return sum(line.split()[:1] == ["policy"] for line in text.splitlines())


@pytest.mark.parametrize("table_of", ["summary", "seeds"])
@pytest.mark.parametrize("width", [30, 50, 64, 80])
def test_a_table_narrower_than_it_needs_is_split_and_loses_nothing(
    table_of: str, width: int
) -> None:
    text = _printed(table_of, width)
    wide = _printed(table_of, 400)
    assert max(map(len, text.splitlines())) <= width and "…" not in text
    assert _parts(wide) == 1
    parts = _parts(text)
    assert parts > 1 if width < 64 else parts >= 1
    for policy in POLICIES:  # every part names every policy
        assert sum(line.split()[:1] == [policy] for line in text.splitlines()) == parts
    # Every header word, figure and caption word of the wide table is there (not its rule).
    assert {w for w in wide.split() if "─" not in w} <= set(text.split())


def test_at_80_columns_a_long_policy_name_folds_rather_than_split_the_table() -> None:
    text = _printed("summary", 80, (*POLICIES, "a-long-policy-file-name"))
    assert _parts(text) == 1 and max(map(len, text.splitlines())) <= 80
