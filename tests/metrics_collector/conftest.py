"""Fixtures for tests that run a real Prometheus on loopback (see tests/prometheus_server.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.prometheus_server import PrometheusFactory


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[PrometheusFactory]:
    """Starts real Prometheus servers; every one is stopped at teardown, pass or fail.

    Skips when ``prometheus``/``promtool`` are missing, except under ``CI=true`` where it fails.
    """
    factory = PrometheusFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.stop_all()
