"""Checkpoint costs of tide's worker runtime: blocked time, save, load, SIGTERM-to-exit, kill -9.

Usage: python benchmarks/checkpoint.py [--json PATH] [--dir /tmp/tide-bench] [--kill-trials 20]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from worker_runtime import AsyncCheckpointer, CheckpointStore  # noqa: E402

MB = 1 << 20
CHUNK_BYTES = 64 * MB

# A worker with `pad_mb` of state that trains until killed; prints one JSON line per event.
WORKER = """
import json, os, sys, time, hashlib, torch
from worker_runtime import ElasticRun
ckpt, pad_mb, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
extras = {"pad": torch.zeros(pad_mb * 262144)}
run = ElasticRun(checkpoint_dir=ckpt, model=model, optimizer=opt, micro_batch_size=4,
                 global_batch_size=4, checkpoint_every_steps=every, extras=extras,
                 keep_checkpoints=2)
def digest():
    return hashlib.sha256(model.weight.detach().numpy().tobytes()).hexdigest()[:16]
with run:
    i = run.resume_info
    print(json.dumps({"event": "start", "step": run.step, "lost_samples": i.lost_samples,
                      "lost_steps": i.lost_steps, "digest": digest()}), flush=True)
    loader = torch.utils.data.DataLoader(list(range(10**6)), batch_size=4,
                                         sampler=run.make_sampler(range(10**6)))
    for _ in run.epochs(1):
        for batches in run.steps(loader):
            for b in batches:
                model(b.float().reshape(-1, 1).repeat(1, 16)).sum().backward()
            opt.step(); opt.zero_grad()
            extras["pad"] += 1.0
            time.sleep(0.02)
            event = {"event": "step", "step": run.step + 1, "digest": digest()}
            print(json.dumps(event), flush=True)
"""


def make_state(size_bytes: int) -> dict[str, Any]:
    chunks = max(1, size_bytes // CHUNK_BYTES)
    per = size_bytes // chunks // 4
    return {"model": {f"w{i}": torch.randn(per) for i in range(chunks)}, "step": 0}


def bench_save_load(directory: Path, size_mb: int, repeats: int) -> list[dict[str, Any]]:
    shutil.rmtree(directory, ignore_errors=True)
    store = CheckpointStore(directory, keep=2)
    checkpointer = AsyncCheckpointer(store)
    state = make_state(size_mb * MB)
    blocked, total, load = [], [], []
    first_blocked = 0.0
    for i in range(repeats + 1):
        start = time.perf_counter()
        result = checkpointer.save(state, step=i, epoch=0, world_size=1, blocking=False)
        checkpointer.wait()
        elapsed = time.perf_counter() - start
        if i == 0:  # the first save allocates (page-faults) the host buffers
            first_blocked = result.blocked_s
            continue
        blocked.append(result.blocked_s)
        total.append(elapsed)
        start = time.perf_counter()
        loaded = store.load_latest()
        load.append(time.perf_counter() - start)
        assert loaded is not None and loaded[0].step == i
        del loaded
    case = {"state_mb": size_mb, "repeats": repeats}
    shutil.rmtree(directory, ignore_errors=True)
    return [
        {"metric": "save_blocked_median", "value": statistics.median(blocked), "unit": "s", **case},
        {"metric": "save_blocked_first", "value": first_blocked, "unit": "s", **case},
        {"metric": "save_total_median", "value": statistics.median(total), "unit": "s", **case},
        {"metric": "load_median", "value": statistics.median(load), "unit": "s", **case},
    ]


def start_worker(directory: Path, pad_mb: int, every: int) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, str(directory), str(pad_mb), str(every)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )


def read_until(proc: subprocess.Popen[str], event: str, count: int = 1) -> list[dict[str, Any]]:
    assert proc.stdout is not None
    seen: list[dict[str, Any]] = []
    for line in proc.stdout:
        record = json.loads(line)
        seen.append(record)
        if sum(r["event"] == event for r in seen) >= count:
            return seen
    raise RuntimeError(f"worker exited before {count} {event} events")


def bench_sigterm(directory: Path, size_mb: int, repeats: int) -> list[dict[str, Any]]:
    times = []
    for _ in range(repeats):
        shutil.rmtree(directory, ignore_errors=True)
        proc = start_worker(directory, size_mb, every=10**9)
        try:
            read_until(proc, "step", 5)
            start = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=120)
            times.append(time.perf_counter() - start)
            assert code == 143, f"exit code {code}"
        finally:
            proc.kill()
            proc.wait()
    shutil.rmtree(directory, ignore_errors=True)
    return [
        {
            "metric": "sigterm_to_exit_median",
            "value": statistics.median(times),
            "unit": "s",
            "state_mb": size_mb,
            "repeats": repeats,
        }
    ]


def bench_kill9(directory: Path, trials: int, pad_mb: int, every: int) -> list[dict[str, Any]]:
    rng = random.Random(7)
    shutil.rmtree(directory, ignore_errors=True)
    digests: dict[int, str] = {}
    corrupt = 0
    lost_steps: list[int] = []
    for trial in range(trials + 1):
        proc = start_worker(directory, pad_mb, every)
        try:
            start = read_until(proc, "start")[0]
            if trial > 0:
                corrupt += int(start["step"] > 0 and digests.get(start["step"]) != start["digest"])
                lost_steps.append(start["lost_steps"])
            if trial == trials:
                break
            for record in read_until(proc, "step", rng.randint(1, 3 * every)):
                if record["event"] == "step":
                    digests[record["step"]] = record["digest"]
            time.sleep(rng.uniform(0.0, 0.1))
            proc.send_signal(signal.SIGKILL)
            assert proc.stdout is not None
            for line in proc.stdout:  # steps logged before the kill landed
                record = json.loads(line)
                if record["event"] == "step":
                    digests[record["step"]] = record["digest"]
        finally:
            proc.kill()
            proc.wait()
    shutil.rmtree(directory, ignore_errors=True)
    case = {"trials": trials, "state_mb": pad_mb, "checkpoint_every_steps": every}
    return [
        {"metric": "kill9_corrupt_loads", "value": corrupt, "unit": "count", **case},
        {"metric": "kill9_lost_steps_max", "value": max(lost_steps), "unit": "count", **case},
        {
            "metric": "kill9_lost_steps_median",
            "value": statistics.median(lost_steps),
            "unit": "count",
            **case,
        },
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, help="write the records as a JSON list here")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "tide-bench")
    parser.add_argument("--kill-trials", type=int, default=20)
    args = parser.parse_args()
    records: list[dict[str, Any]] = []
    records += bench_save_load(args.dir, 100, repeats=5)
    records += bench_save_load(args.dir, 1024, repeats=3)
    records += bench_sigterm(args.dir, 100, repeats=3)
    records += bench_sigterm(args.dir, 1024, repeats=1)
    records += bench_kill9(args.dir, args.kill_trials, pad_mb=32, every=4)
    print(f"{'metric':<26} {'value':>10} unit   case")
    for r in records:
        case = ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("metric", "value", "unit"))
        print(f"{r['metric']:<26} {r['value']:>10.3f} {r['unit']:<6} {case}")
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    main()
