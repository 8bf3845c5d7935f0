"""tide's trace format with a job's measured throughput by replicas: curve, bad rows, round trip."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_policy.vocabulary.state import JobKey
from simulations.errors import TraceError
from simulations.profiles import ThroughputMeasurement, builtin_job_type, measured_profile
from simulations.trace_rows import (
    TraceRow,
    format_throughput,
    parse_throughput,
    write_tide_trace,
)
from simulations.traces import load_tide_trace, read_trace_rows
from simulations.volcano import run_session
from tests.simulations.helpers import make_sim

HEADER = "job_id,submit_s,replicas,duration_s,elastic,min_replicas,max_replicas,throughput\n"


@pytest.mark.parametrize(
    ("throughput", "replicas", "samples_per_s"),
    [
        ("2:180;4:300", 2, 180.0),
        ("2:180;4:300", 3, 240.0),  # halfway between 2 and 4
        ("2:180;4:300", 1, 90.0),  # below the smallest size: 180 x 1/2
        ("2:180;4:300", 4, 300.0),
        ("2:180;4:300", 16, 300.0),  # past the largest size: flat
        ("4@1:320;4@2:300", 4, 300.0),  # two placements: the slower
        ("1:100;2:190;4:350;8:600", 6, 475.0),  # 350 + (600 - 350) x 2/4
        ("1:100;2:120;3:90", 3, 90.0),  # a measured slowdown is kept, not smoothed away
    ],
    ids=[
        "at-a-measured-size",
        "interpolated",
        "below-smallest-proportional",
        "largest",
        "past-largest-flat",
        "slowest-placement",
        "interpolated-wide-gap",
        "measured-slowdown",
    ],
)
def test_measured_curve_rate(throughput: str, replicas: int, samples_per_s: float) -> None:
    profile = measured_profile("t", parse_throughput(throughput))
    assert profile.rate(replicas) == pytest.approx(samples_per_s)
    assert profile.samples_per_unit == 1.0


@given(
    st.lists(
        st.tuples(st.integers(1, 64), st.floats(1.0, 1e5)),
        min_size=1,
        max_size=8,
        unique_by=lambda p: p[0],
    )
)
def test_measured_curve_never_beats_a_measurement_or_its_neighbours(
    points: list[tuple[int, float]],
) -> None:
    # Between two measured sizes the rate lies between theirs; past the largest it is the
    # largest's; never above the fastest measurement.
    profile = measured_profile(
        "t", [ThroughputMeasurement(replicas=n, samples_per_s=x) for n, x in points]
    )
    sizes = sorted(points)
    best = max(x for _, x in points)
    slack = best * 1e-9  # interpolation's rounding
    for n in range(1, 129):
        rate = profile.rate(n)
        assert 0 < rate <= best + slack
        below = [x for m, x in sizes if m <= n]
        above = [x for m, x in sizes if m >= n]
        if below and above:
            assert min(below[-1], above[0]) - slack <= rate <= max(below[-1], above[0]) + slack
        elif below:
            assert rate == below[-1]


def test_job_with_a_measured_curve_finishes_when_its_curve_says(tmp_path: Path) -> None:
    # Work: 600 s at 2 replicas x 180 samples/s = 108,000 samples. 100 s at 2 replicas make
    # 18,000; the job is then resized to 4 (300 samples/s, no restart cost): the 90,000 left
    # take 300 s, so it finishes at t = 400 s. The built-in default curve would say otherwise.
    path = tmp_path / "t.csv"
    path.write_text(
        "job_id,submit_s,replicas,duration_s,elastic,min_replicas,max_replicas,"
        "restart_cost_s,throughput\n"
        'ns/measured,0,2,600,true,1,4,0,"1:100;2:180;4:300"\n'
    )
    (spec,) = load_tide_trace(path).jobs
    assert spec.work_units == pytest.approx(108_000.0)
    sim = make_sim([spec])
    run_session(sim)
    sim.advance(100.0)
    job = sim.jobs[JobKey("ns/measured")]
    assert job.done_units == pytest.approx(18_000.0)
    sim.resize(job, 4)
    run_session(sim)
    done_s, finishing = sim.next_completion()
    assert finishing is job and done_s == pytest.approx(400.0)
    default = builtin_job_type("transformer").profile
    assert 100 + (600 - 100) * default.rate(2) / default.rate(4) != pytest.approx(400.0)


def test_job_type_is_the_fallback_when_throughput_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "job_id,submit_s,replicas,duration_s,job_type,throughput\n"
        "a,0,2,600,recommender,\n"
        'b,0,2,600,recommender,"2:50"\n'
    )
    a, b = load_tide_trace(path).jobs
    assert a.profile == builtin_job_type("recommender").profile
    assert b.profile.rate(2) == 50.0 and b.work_units == pytest.approx(30_000.0)


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ('"1:100;2@x:180"', r"throughput: entry 2 \('2@x:180'\): nodes 'x' is not a whole number"),
        ('"1:100;2:-5"', r"throughput: entry 2 \('2:-5'\): samples_per_s must be > 0"),
        ('"0:100"', r"throughput: entry 1 \('0:100'\): replicas must be in \[1, 128\]"),
        ('"200:100"', r"replicas must be in \[1, 128\], got 200"),
        ('"2@3:100"', r"nodes must be in \[1, replicas=2\], got 3"),
        ('"1:100;1:110"', "entry 2 .*given twice"),
        ('"1=100"', "entry 1 .*expected R:X"),
        ('"1:nan"', "samples_per_s must be finite"),
        ('"1.5:100"', "replicas '1.5' is not a whole number"),
        ('";"', "throughput: no measurements"),
    ],
    ids=[
        "bad-nodes",
        "negative-rate",
        "zero-replicas",
        "too-many-replicas",
        "more-nodes-than-replicas",
        "duplicate-size",
        "no-colon",
        "nan-rate",
        "fractional-replicas",
        "empty-list",
    ],
)
def test_bad_throughput_names_file_line_and_column(tmp_path: Path, cell: str, message: str) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(HEADER + 'ok,0,2,600,false,2,2,"2:10"\n' + f"bad,0,2,600,false,2,2,{cell}\n")
    with pytest.raises(TraceError, match=message) as info:
        load_tide_trace(path)
    assert str(info.value).startswith(f"{path}:3: throughput")
    assert load_tide_trace(path, skip_bad_rows=True).skipped_rows == 1


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('"throughput": [{"replicas": 2, "rate": 5}]', "unknown keys \\['rate'\\]"),
        ('"throughput": [{"replicas": 2.5, "samples_per_s": 5}]', "replicas 2.5 is not a whole"),
        ('"throughput": [3]', "expected an object"),
        ('"throughput": 7', "expected text, a list or an object"),
        ('"throughput": {"2@9": 5}', "nodes must be in"),
        ('"replicas_over_time": [[0, 2], [0, 4]]', "replicas_over_time: entry 2 .*must increase"),
        ('"replicas_over_time": "0:2;60:-1"', "replicas_over_time: entry 2 .*>= 0"),
    ],
    ids=[
        "unknown-key",
        "fractional-replicas",
        "not-an-object",
        "not-a-collection",
        "nodes-above-replicas",
        "times-not-increasing",
        "negative-replicas",
    ],
)
def test_bad_jsonl_row_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(
        '{"job_id": "a", "submit_s": 0, "replicas": 2, "duration_s": 60}\n'
        f'{{"job_id": "b", "submit_s": 0, "replicas": 2, "duration_s": 60, {line}}}\n'
    )
    with pytest.raises(TraceError, match=message) as info:
        read_trace_rows(path)
    assert info.value.line == 2 and str(info.value).startswith(f"{path}:2: ")


def test_jsonl_forms_of_throughput_agree(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"job_id": "s", "submit_s": 0, "replicas": 2, "duration_s": 60,'
        ' "throughput": "1:10;4@2:30"}\n'
        '{"job_id": "l", "submit_s": 0, "replicas": 2, "duration_s": 60,'
        ' "throughput": [{"replicas": 1, "samples_per_s": 10},'
        ' {"replicas": 4, "nodes": 2, "samples_per_s": 30}]}\n'
        '{"job_id": "o", "submit_s": 0, "replicas": 2, "duration_s": 60,'
        ' "throughput": {"1": 10, "4@2": 30}}\n'
    )
    rows = read_trace_rows(path)
    assert {r.throughput for r in rows} == {
        (
            ThroughputMeasurement(replicas=1, samples_per_s=10.0),
            ThroughputMeasurement(replicas=4, samples_per_s=30.0, nodes=2),
        )
    }


finite = st.floats(0.0, 1e7, allow_nan=False, allow_infinity=False)
measurements = st.lists(
    st.builds(
        ThroughputMeasurement,
        replicas=st.integers(1, 128),
        samples_per_s=st.floats(1e-3, 1e7),
        nodes=st.none(),
    ),
    max_size=5,
    unique_by=lambda m: m.replicas,
).map(lambda ms: tuple(sorted(ms, key=lambda m: m.replicas)))


@st.composite
def trace_rows(draw: st.DrawFn) -> TraceRow:
    replicas = draw(st.integers(1, 16))
    times = sorted(set(draw(st.lists(finite, max_size=4))))
    return TraceRow(
        job_id=draw(st.text('abcdefgh/-_," ;:', min_size=1, max_size=12)),
        submit_s=draw(finite),
        replicas=replicas,
        duration_s=draw(st.floats(1e-3, 1e7)),
        queue=draw(st.none() | st.sampled_from(["research", "production"])),
        elastic=draw(st.booleans()),
        min_replicas=draw(st.none() | st.integers(1, replicas)),
        max_replicas=draw(st.none() | st.integers(replicas, 64)),
        gpus_per_replica=draw(st.integers(1, 8)),
        job_type=draw(st.none() | st.sampled_from(["vision-cnn", "speech-rnn"])),
        restart_cost_s=draw(st.none() | finite),
        checkpoint_interval_s=draw(st.none() | st.floats(1.0, 1e5)),
        throughput=draw(measurements),
        replicas_over_time=tuple((t, draw(st.integers(0, 64))) for t in times),
    )


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(trace_rows(), max_size=6), suffix=st.sampled_from([".csv", ".jsonl"]))
def test_round_trip_writes_what_it_reads(
    tmp_path_factory: pytest.TempPathFactory, rows: list[TraceRow], suffix: str
) -> None:
    path = tmp_path_factory.mktemp("rt") / f"trace{suffix}"
    assert write_tide_trace(path, rows) == len(rows)
    assert read_trace_rows(path) == rows
    replayed = load_tide_trace(path, skip_bad_rows=True).jobs
    expected = sorted(
        (r.workload_job(source="") for r in rows if not r.workload_job(source="").problems()),
        key=lambda j: j.submit_s,
    )
    assert [dataclasses.replace(j, source="") for j in replayed] == expected


def test_format_throughput_reads_back_exactly() -> None:
    ms = (
        ThroughputMeasurement(replicas=1, samples_per_s=0.1 + 0.2),
        ThroughputMeasurement(replicas=8, samples_per_s=1e-7, nodes=2),
    )
    assert format_throughput(ms) == "1:0.30000000000000004;8@2:1e-07"
    assert parse_throughput(format_throughput(ms)) == ms
