"""The real-Prometheus fixture does what the other tests rely on."""

from __future__ import annotations

import math
import os
import shutil
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Gauge

from tests.prometheus_server import (
    Exporter,
    PrometheusFactory,
    Series,
    openmetrics_text,
    require_binaries,
)


@pytest.mark.parametrize(
    ("series", "expected"),
    [
        (
            [Series("g", {"b": "2", "a": "1"}, [(20.0, 2.0), (10.0, 1.0)])],
            '# TYPE g gauge\ng{a="1",b="2"} 1.0 10.000\ng{a="1",b="2"} 2.0 20.000\n# EOF\n',
        ),
        (
            [Series("c_total", {}, [(1.5, 3.0)], type="counter")],
            "# TYPE c counter\nc_total 3.0 1.500\n# EOF\n",
        ),
        (
            [
                Series("g", {"q": 'a"b'}, [(1.0, math.nan)]),
                Series("h", {}, [(1.0, 0.0)]),
                Series("g", {"q": "c"}, [(1.0, 1.0)]),
            ],
            '# TYPE g gauge\ng{q="a\\"b"} NaN 1.000\ng{q="c"} 1.0 1.000\n'
            "# TYPE h gauge\nh 0.0 1.000\n# EOF\n",
        ),
    ],
    ids=["sorted-labels-and-times", "counter-family-without-total", "families-grouped-nan-escaped"],
)
def test_openmetrics_text(series: list[Series], expected: str) -> None:
    assert openmetrics_text(series) == expected


def test_counter_without_total_is_refused() -> None:
    with pytest.raises(ValueError, match="must end in _total"):
        openmetrics_text([Series("c", {}, [(1.0, 1.0)], type="counter")])


@pytest.mark.parametrize(
    ("ci", "outcome"),
    [("", pytest.skip.Exception), ("true", pytest.fail.Exception)],
    ids=["local-skips", "ci-fails"],
)
def test_missing_binaries(
    monkeypatch: pytest.MonkeyPatch, ci: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="prometheus is not installed"):
        require_binaries()


@pytest.mark.prometheus
def test_backfill_is_queryable_up_to_now(prometheus_factory: PrometheusFactory) -> None:
    """promtool writes the newest 2 h block too: a sample 5 s old reads at once."""
    now = time.time()
    history = [(now - 3 * 3600 + 60 * i, float(i)) for i in range(180)] + [(now - 5, 999.0)]
    server = prometheus_factory.start(
        series=[
            Series("g", {"a": "x"}, history),
            Series(
                "c_total",
                {"a": "y"},
                [(now - 600 + 15 * i, 10.0 * i) for i in range(40)],
                type="counter",
            ),
            Series("n", {"a": "z"}, [(now - 30, math.nan)]),
        ]
    )
    [newest] = server.query("g")
    assert float(newest["value"][1]) == 999.0
    [stamp] = server.query("timestamp(g)")
    assert float(stamp["value"][1]) == pytest.approx(now - 5, abs=0.01)
    [count] = server.query("count_over_time(g[4h])")
    assert float(count["value"][1]) == 181
    [rate] = server.query("rate(c_total[2m])")
    assert float(rate["value"][1]) == pytest.approx(10.0 / 15.0)
    [nan] = server.query("n")
    assert math.isnan(float(nan["value"][1]))


@pytest.mark.prometheus
def test_two_backfills_that_overlap_both_read(prometheus_factory: PrometheusFactory) -> None:
    from tests.prometheus_server import backfill

    now = time.time()
    server = prometheus_factory.create(series=[Series("g", {"a": "1"}, [(now - 60, 1.0)])])
    backfill(server.tsdb_dir, [Series("g", {"a": "2"}, [(now - 50, 2.0)])])
    server.start()
    values = sorted(float(r["value"][1]) for r in server.query("g"))
    assert values == [1.0, 2.0]


@pytest.mark.prometheus
def test_scrapes_a_live_exporter_and_stops(prometheus_factory: PrometheusFactory) -> None:
    registry = CollectorRegistry()
    Gauge("probe_value", "A test gauge.", ["job_label"], registry=registry).labels("w").set(7)
    with Exporter(registry) as exporter:
        server = prometheus_factory.start(scrape_targets=[exporter.target], scrape_interval_s=0.5)
        [found] = server.wait_for_series('probe_value{job_label="w"}', timeout_s=20)
        assert float(found["value"][1]) == 7.0
        pid = server._proc.pid if server._proc else -1
        server.stop()
    assert not server.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{server.url}/-/ready", timeout=1)


@pytest.mark.prometheus
def test_a_server_that_cannot_start_says_why(prometheus_factory: PrometheusFactory) -> None:
    server = prometheus_factory.create(extra_args=["--no-such-flag"])
    with pytest.raises(RuntimeError, match="exited"):
        server.start()
    assert not server.running
