"""A simulation repeats exactly, whatever Python's string-hash seed: no set order leaks out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import json
from simulations.api import PolicyRun, default_policy_for, load_workload, run_one
from simulations.cluster_config import BUILTIN_CLUSTER
from simulations.run import RunOptions
workload = load_workload(seed=1, duration_s=8 * 3600.0)
out = {}
for kind in ("tide", "static", "threshold", "hpa", "optimus", "tiresias"):
    policy = default_policy_for(BUILTIN_CLUSTER) if kind == "tide" else None
    result = run_one(PolicyRun(kind, kind, policy), workload=workload, cluster=BUILTIN_CLUSTER,
                     options=RunOptions())
    out[kind] = [[j.key, j.start_s, j.end_s, j.rescales] for j in result.jobs]
print(json.dumps(out))
"""


def run_with_hash_seed(seed: str) -> object:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120,
        check=True, cwd=REPO,
    )  # fmt: skip
    return json.loads(done.stdout)


def test_every_policy_repeats_under_another_hash_seed():
    first = run_with_hash_seed("1")
    assert first["tide"], "the workload has jobs"
    assert run_with_hash_seed("2") == first
