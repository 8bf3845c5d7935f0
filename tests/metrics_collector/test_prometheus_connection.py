"""What PrometheusSource sends: auth and extra headers, a token file re-read every round."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from metrics_collector.prometheus import PrometheusConnection, PrometheusSource
from scheduler_policy.policy.spec import MetricsSettings


class Recorder(BaseHTTPRequestHandler):
    """Answers every query with an empty result and records the request's headers."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        Recorder.seen.append(dict(self.headers))
        kind = "matrix" if "query_range" in self.path else "vector"
        body = json.dumps({"status": "success", "data": {"resultType": kind, "result": []}})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_the_token_file_is_read_every_round_and_headers_go_with_each_query(
    recorder: str, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    source = PrometheusSource(
        connection=PrometheusConnection(
            url=recorder, bearer_token_file=str(token), headers={"X-Scope-OrgID": "ml"}
        ),
        settings=MetricsSettings(),
    )
    sample = source.sample(now_s=1_700_000_000.0)
    # Nothing in the answers: missing, never zero, and the round is not fresh.
    assert not sample.fresh
    assert "cluster allocatable GPUs: no samples" in source.last_report.problems
    assert {h["Authorization"] for h in Recorder.seen} == {"Bearer first"}
    assert {h["X-Scope-OrgID"] for h in Recorder.seen} == {"ml"}
    Recorder.seen = []
    token.write_text("second\n")
    source.sample(now_s=1_700_000_060.0)
    assert {h["Authorization"] for h in Recorder.seen} == {"Bearer second"}
    source.close()


def test_basic_auth_is_sent(recorder: str) -> None:
    source = PrometheusSource(
        connection=PrometheusConnection(url=recorder, basic_auth=("tide", "s3cret")),
    )
    source.sample(now_s=1_700_000_000.0)
    # base64("tide:s3cret")
    assert {h["Authorization"] for h in Recorder.seen} == {"Basic dGlkZTpzM2NyZXQ="}
    source.close()


def test_a_missing_token_file_is_a_stale_round_that_names_it(recorder: str, tmp_path: Path) -> None:
    source = PrometheusSource(
        connection=PrometheusConnection(url=recorder, bearer_token_file=str(tmp_path / "gone")),
    )
    sample = source.sample(now_s=1_700_000_000.0)
    assert not sample.fresh
    assert Recorder.seen == []
    assert not source.last_report.reachable
    assert "bearer token file" in source.last_report.problems[0]
    source.close()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("url", "prometheus:9090", "url: must start with http"),
        ("timeout_s", 0.0, "timeout_s: must be a positive number"),
        ("attempts", 0, "attempts: must be at least 1"),
        ("budget_fraction", 1.5, r"budget_fraction: must be in \(0, 1\]"),
    ],
    ids=["url-without-scheme", "timeout-zero", "no-attempts", "budget-over-the-interval"],
)
def test_connection_settings_are_checked(field: str, value: object, message: str) -> None:
    settings: dict[str, object] = {"url": "http://127.0.0.1:9090", field: value}
    with pytest.raises(ValueError, match=message):
        PrometheusConnection(**settings)  # type: ignore[arg-type]
