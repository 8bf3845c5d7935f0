"""Checkpoint costs of tide's worker runtime: blocked time, save, load, SIGTERM-to-exit, kill -9,
and steps lost by graceful rescales of a real 2-agent torchrun job on loopback.

Blocked time is measured three ways: the first save of a checkpointer that was never prepared
(what every first save cost before buffers were prepared), the first and later saves after a
preparation that ran in the background while the main thread computed, and the saves of an
``ElasticRun`` (which prepares on entering and after its first step) as the training loop sees
them. The preparation's own cost is reported separately: what the caller paid, and what the
background thread spent.

Usage: python benchmarks/checkpoint.py [--json PATH] [--dir /tmp/tide-bench] [--kill-trials 20]
    [--rescales 4] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
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

from worker_runtime import (  # noqa: E402
    AsyncCheckpointer,
    CheckpointStore,
    ElasticRun,
    SaveResult,
)

ELASTIC_SCRIPT = REPO / "tests" / "worker_runtime" / "elastic_script.py"

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
            event = {"event": "step", "step": run.step + 1, "digest": digest(),
                     "writing": run.checkpoint_write_in_flight}
            print(json.dumps(event), flush=True)
"""


def make_state(size_bytes: int) -> dict[str, Any]:
    chunks = max(1, size_bytes // CHUNK_BYTES)
    per = size_bytes // chunks // 4
    return {"model": {f"w{i}": torch.randn(per) for i in range(chunks)}, "step": 0}


def busy(seconds: float) -> None:
    """Stand-in for training on the main thread: single-threaded matrix products."""
    a = torch.randn(256, 256)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        a = torch.tanh(a @ a)


def bench_save_load(directory: Path, size_mb: int, repeats: int) -> list[dict[str, Any]]:
    shutil.rmtree(directory, ignore_errors=True)
    state = make_state(size_mb * MB)
    # Baseline: a checkpointer whose buffers nobody prepared allocates them in its first save.
    cold = AsyncCheckpointer(CheckpointStore(directory / "cold", keep=1))
    unprepared_first = cold.save(state, step=0, epoch=0, world_size=1, blocking=False).blocked_s
    cold.wait()
    del cold
    shutil.rmtree(directory, ignore_errors=True)
    store = CheckpointStore(directory, keep=2)
    checkpointer = AsyncCheckpointer(store)
    start = time.perf_counter()
    checkpointer.prepare(state)
    prepare_call = time.perf_counter() - start
    busy(3.0)  # the steps before the first save comes due (e.g. 100 steps of 30 ms)
    blocked, waited, total, load = [], [], [], []
    for i in range(repeats + 1):
        start = time.perf_counter()
        result = checkpointer.save(state, step=i, epoch=0, world_size=1, blocking=False)
        checkpointer.wait()
        blocked.append(result.blocked_s)
        waited.append(result.waited_s)
        total.append(time.perf_counter() - start)
        start = time.perf_counter()
        loaded = store.load_latest()
        load.append(time.perf_counter() - start)
        assert loaded is not None and loaded[0].step == i
        del loaded
    (prepared,) = checkpointer.prepares
    case = {"state_mb": size_mb, "repeats": repeats}
    shutil.rmtree(directory, ignore_errors=True)
    return [
        {"metric": "save_blocked_first", "value": blocked[0], "unit": "s", **case},
        {"metric": "save_blocked_first_waited", "value": waited[0], "unit": "s", **case},
        {
            "metric": "save_blocked_median",
            "value": statistics.median(blocked[1:]),
            "unit": "s",
            **case,
        },
        {"metric": "save_blocked_max", "value": max(blocked), "unit": "s", **case},
        {
            "metric": "save_blocked_first_unprepared",
            "value": unprepared_first,
            "unit": "s",
            **case,
        },
        {"metric": "prepare_caller_blocked", "value": prepare_call, "unit": "s", **case},
        {"metric": "prepare_background", "value": prepared.background_s, "unit": "s", **case},
        {"metric": "save_total_median", "value": statistics.median(total), "unit": "s", **case},
        {"metric": "load_median", "value": statistics.median(load), "unit": "s", **case},
    ]


def bench_elastic_run_saves(
    directory: Path, size_mb: int, every: int, saves: int
) -> list[dict[str, Any]]:
    """Blocked time of every periodic save of an ElasticRun, the first one included."""
    shutil.rmtree(directory, ignore_errors=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)  # state created at step 1
    extras = {"pad": torch.zeros(size_mb * MB // 4)}
    steps = every * saves + 1
    run = ElasticRun(
        checkpoint_dir=directory,
        model=model,
        optimizer=optimizer,
        micro_batch_size=4,
        global_batch_size=4,
        checkpoint_every_steps=every,
        extras=extras,
        keep_checkpoints=1,
        environ={},
    )
    results: list[SaveResult] = []
    start = time.perf_counter()
    with run:
        enter_s = time.perf_counter() - start
        data = torch.utils.data.TensorDataset(torch.arange(4 * steps))
        loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=run.make_sampler(data))
        for _ in run.epochs(1):
            for batches in run.steps(loader):
                if run.last_save is not None and (not results or results[-1] is not run.last_save):
                    results.append(run.last_save)
                for (b,) in batches:
                    model(b.float().reshape(-1, 1).repeat(1, 16)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
                busy(0.05)
    prepares = run.checkpointer.prepares
    shutil.rmtree(directory, ignore_errors=True)
    assert len(results) == saves, results
    case = {"state_mb": size_mb, "checkpoint_every_steps": every, "step_s": 0.05, "saves": saves}
    blocked = [r.blocked_s for r in results]
    return [
        {"metric": "run_save_blocked_first", "value": blocked[0], "unit": "s", **case},
        {
            "metric": "run_save_blocked_first_waited",
            "value": results[0].waited_s,
            "unit": "s",
            **case,
        },
        {
            "metric": "run_save_blocked_median",
            "value": statistics.median(blocked[1:]),
            "unit": "s",
            **case,
        },
        {"metric": "run_save_blocked_max", "value": max(blocked), "unit": "s", **case},
        {"metric": "run_enter", "value": enter_s, "unit": "s", **case},
        {
            "metric": "run_prepare_background",
            "value": sum(p.background_s for p in prepares),
            "unit": "s",
            "where": "background thread from enter and after step 1",
            **case,
        },
        {
            "metric": "run_prepare_caller_blocked",
            "value": sum(p.call_s for p in prepares),
            "unit": "s",
            "where": "enter and end of step 1",
            **case,
        },
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
    bounds: list[int] = []  # N + W for each kill, W measured in the killed process
    overlap: dict[int, int] = {}  # save step -> steps run while its write was in flight
    for trial in range(trials + 1):
        proc = start_worker(directory, pad_mb, every)
        try:
            start = read_until(proc, "start")[0]
            if trial > 0:
                corrupt += int(start["step"] > 0 and digests.get(start["step"]) != start["digest"])
                lost_steps.append(start["lost_steps"])
                bounds.append(every + overlap.get(start["step"] + every, 0))
            if trial == trials:
                break
            overlap = {}
            records = read_until(proc, "step", rng.randint(1, 3 * every))
            time.sleep(rng.uniform(0.0, 0.1))
            proc.send_signal(signal.SIGKILL)
            assert proc.stdout is not None
            records += [json.loads(line) for line in proc.stdout]  # logged before the kill
            for record in records:
                if record["event"] == "step":
                    digests[record["step"]] = record["digest"]
                    if record["writing"]:
                        save = (record["step"] - 1) // every * every
                        overlap[save] = overlap.get(save, 0) + 1
        finally:
            proc.kill()
            proc.wait(timeout=30)
    shutil.rmtree(directory, ignore_errors=True)
    case = {"trials": trials, "state_mb": pad_mb, "checkpoint_every_steps": every}
    violations = sum(lost > bound for lost, bound in zip(lost_steps, bounds, strict=True))
    return [
        {"metric": "kill9_corrupt_loads", "value": corrupt, "unit": "count", **case},
        {"metric": "kill9_lost_steps_max", "value": max(lost_steps), "unit": "count", **case},
        {"metric": "kill9_bound_n_plus_w_max", "value": max(bounds), "unit": "count", **case},
        {"metric": "kill9_bound_violations", "value": violations, "unit": "count", **case},
        {"metric": "kill9_bound_guaranteed", "value": 2 * every, "unit": "count", **case},
        {
            "metric": "kill9_lost_steps_median",
            "value": statistics.median(lost_steps),
            "unit": "count",
            **case,
        },
    ]


RDZV_CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=5"
RESCALE_ARGS = (
    "--epochs",
    "1000",
    "--dataset-size",
    "240",
    "--global-batch",
    "12",
    "--micro-batch",
    "2",
    "--every-steps",
    "1000",
    "--step-sleep-s",
    "0.1",
)


def read_events(log_dir: Path) -> list[dict[str, Any]]:
    events = []
    for path in sorted(log_dir.glob("events-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.endswith("}"):  # a line being written is skipped until complete
                events.append(json.loads(line))
    return events


def alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] != "Z"


def wait_until(predicate: Any, *, timeout_s: float, what: str) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        if predicate():
            return time.perf_counter() - start
        time.sleep(0.01)
    raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")


def bench_graceful_rescale(directory: Path, changes: int) -> list[dict[str, Any]]:
    """Scale a 2-agent torchrun job up and down `changes` times; count steps trained twice."""
    shutil.rmtree(directory, ignore_errors=True)
    ckpt, logs = directory / "ckpt", directory / "log"
    logs.mkdir(parents=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        OMP_NUM_THREADS="1",
    )
    env.pop("TIDE_METRICS_PORT", None)
    agents: list[subprocess.Popen[bytes]] = []

    def start_agent() -> subprocess.Popen[bytes]:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1:3",
            "--nproc-per-node=1",
            "--max-restarts=20",
            "--monitor-interval=0.1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-conf={RDZV_CONF},is_host={int(not agents)}",
            "--rdzv-id=bench",
            str(ELASTIC_SCRIPT),
            "--ckpt-dir",
            str(ckpt),
            "--log-dir",
            str(logs),
            *RESCALE_ARGS,
        ]
        out = open(directory / f"agent-{len(agents)}.log", "wb")  # noqa: SIM115
        agents.append(
            subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
        return agents[-1]

    def steps_at(world: int, after_s: float) -> int:
        return sum(
            e["event"] == "step"
            and e["rank"] == 0
            and e["world"] == world
            and e["time_s"] >= after_s
            for e in read_events(logs)
        )

    exit_times: list[float] = []
    pause_times: list[float] = []
    try:
        start_agent()
        start_agent()
        wait_until(lambda: steps_at(2, 0) >= 5, timeout_s=90, what="5 steps at world 2")
        extra: subprocess.Popen[bytes] | None = None
        for change in range(changes):
            changed_at = time.time()
            worker_pids = [e["pid"] for e in read_events(logs) if e["event"] == "start"]
            if extra is None:  # scale up: the running agents SIGTERM their workers themselves
                extra = start_agent()
                world = 3
            else:  # scale down: SIGTERM the extra agent, as a pod deletion would
                extra.send_signal(signal.SIGTERM)
                exit_times.append(
                    wait_until(
                        lambda: not any(alive(p) for p in worker_pids),  # noqa: B023
                        timeout_s=60,
                        what="all workers exited",
                    )
                )
                extra.wait(timeout=60)
                extra, world = None, 2
            wait_until(
                lambda: steps_at(world, changed_at) >= 3,  # noqa: B023
                timeout_s=90,
                what=f"3 steps at world {world} after change {change}",
            )
        events = read_events(logs)
    finally:
        for marker in logs.glob("pid-*"):
            pid = int(marker.name.removeprefix("pid-"))
            try:
                if ELASTIC_SCRIPT.name.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError):
                pass
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
            agent.wait(timeout=30)
    rank0_steps = sorted(
        (e["time_s"], e["step"]) for e in events if e["event"] == "step" and e["rank"] == 0
    )
    trained = [step for _, step in rank0_steps]
    retrained = len(trained) - len(set(trained))
    reported = sum(e["lost_steps"] for e in events if e["event"] == "start" and e["resumed"])
    starts = sorted(e["time_s"] for e in events if e["event"] == "start" and e["rank"] == 0)
    for started in starts[1:]:  # last step before a restart -> first step after it
        before = [t for t, _ in rank0_steps if t < started]
        after = [t for t, _ in rank0_steps if t > started]
        pause_times.append(after[0] - before[-1])
    shutil.rmtree(directory, ignore_errors=True)
    worlds = [e["world"] for e in events if e["event"] == "start" and e["rank"] == 0]
    assert len(worlds) == changes + 1, worlds
    case = {"changes": changes, "agents": "2<->3", "step_s": 0.1}
    return [
        {
            "metric": "graceful_rescale_lost_steps",
            "value": max(retrained, reported),
            "unit": "count",
            "retrained_steps": retrained,
            "reported_lost_steps": reported,
            **case,
        },
        {
            "metric": "graceful_sigterm_to_workers_exited_median",
            "value": statistics.median(exit_times),
            "unit": "s",
            "scale_downs": len(exit_times),
            **case,
        },
        {
            "metric": "graceful_sigterm_to_workers_exited_max",
            "value": max(exit_times),
            "unit": "s",
            "scale_downs": len(exit_times),
            **case,
        },
        {
            "metric": "graceful_rescale_pause_median",
            "value": statistics.median(pause_times),
            "unit": "s",
            **case,
        },
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, help="write the records as a JSON list here")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "tide-bench")
    parser.add_argument("--kill-trials", type=int, default=20)
    parser.add_argument("--rescales", type=int, default=4, help="membership changes (even)")
    parser.add_argument("--quick", action="store_true", help="100 MB cases only, fewer trials")
    args = parser.parse_args()
    records: list[dict[str, Any]] = []
    records += bench_save_load(args.dir, 100, repeats=5)
    records += bench_elastic_run_saves(args.dir, 100, every=40, saves=3)
    if not args.quick:
        records += bench_save_load(args.dir, 1024, repeats=3)
        # One 1 GB write takes about 3.5 s here: the interval (100 x ~0.05 s) must be longer.
        records += bench_elastic_run_saves(args.dir, 1024, every=100, saves=3)
    records += bench_sigterm(args.dir, 100, repeats=3)
    if not args.quick:
        records += bench_sigterm(args.dir, 1024, repeats=1)
    records += bench_kill9(args.dir, args.kill_trials, pad_mb=32, every=4)
    records += bench_graceful_rescale(args.dir, args.rescales)
    print(f"{'metric':<42} {'value':>10} unit   case")
    for r in records:
        case = ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("metric", "value", "unit"))
        print(f"{r['metric']:<42} {r['value']:>10.3f} {r['unit']:<6} {case}")
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    main()
