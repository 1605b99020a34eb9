"""Per-request scheduler evidence from a user's app under the Gunicorn hooks (issue 50), in-process.

:class:`tuna_lab.integrations.timing.SchedTiming` is what the hooks'
``post_worker_init`` wraps around the worker's app (tests/test_ledger.py runs
the real hook in a worker process). Here the middleware is called as Gunicorn
calls an app, on this process's real threads and counters, and its header is
read by the load generator's own parser into the ``requests.parquet`` columns,
as the lab server's is (tests/test_anatomy.py). No server is started.
"""

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from tuna_lab.integrations import gunicorn as hooks
from tuna_lab.integrations.timing import SCHED_METRICS, SchedTiming
from tuna_lab.measure import records
from tuna_lab.measure.loadgen.server_timing import parse_server_timing, server_timing_metrics
from tuna_lab.measure.records import Records
from tuna_lab.measure.schema import REQUEST_SCHED_COLUMNS


def busy_app(extra_headers=()):
    def app(environ, start_response):
        # Work on the calling thread and on a second one (a pool's), before the response starts.
        side = threading.Thread(target=lambda: sum(i * i for i in range(200_000)))
        side.start()
        sum(i * i for i in range(200_000))
        side.join()
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2"), *extra_headers])
        return [b"ok"]
    return app


def call(app):
    got = {}

    def start_response(status, headers, exc_info=None):
        got["status"], got["headers"] = status, list(headers)

    body = b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": "/"}, start_response))
    return got["status"], got["headers"], body


def timing_of(headers):
    values = [v for k, v in headers if k.lower() == "server-timing"]
    assert len(values) == 1, headers                  # one header: the app's own and ours in one value
    return values[0]


def frame(timings):
    rec = Records(len(timings), response="any")          # a user's app: its body is not read
    rec.status[:] = 200
    for i, value in enumerate(timings):
        rec.timing[i] = value.encode("latin-1")
    rec.sent[:] = 0.0
    rec.done[:] = 1.0
    rec.scheduled[:] = rec.sent
    rec.origin = 100.0
    return rec.frame({})


def test_a_hooked_apps_response_carries_the_lab_servers_tuna_metrics_into_the_request_columns():
    status, headers, body = call(SchedTiming(busy_app()))
    assert status == "200 OK" and body == b"ok"
    value = timing_of(headers)
    metrics = server_timing_metrics(value)
    # The lab server's metrics, by the same function, with the kernel's migrations where it has them.
    assert set(SCHED_METRICS) - {"tuna-mig"} <= set(metrics) <= set(SCHED_METRICS), value
    app_ms, cpu_ms = float(metrics["app"]["dur"]), float(metrics["cpu"]["dur"])
    # Two threads worked: their CPU is counted (a few ms on any machine), not only the caller's.
    assert app_ms > 0 and cpu_ms > 0, value
    assert parse_server_timing(value) == pytest.approx(app_ms / 1e3)    # server_seconds is the app's time
    row = frame([value]).iloc[0]
    for name, (column, _, _) in records._SCHED_METRICS.items():
        if name in metrics:
            assert not np.isnan(row[column]), (name, value)
    assert row["rq_wait"] >= 0 and row["switches_involuntary"] >= 0
    assert set(REQUEST_SCHED_COLUMNS) <= set(frame([value]).columns)


def test_the_apps_own_server_timing_stays_first_and_a_timed_response_is_left_as_it_is():
    _, headers, _ = call(SchedTiming(busy_app([("Server-Timing", "db;dur=7.5")])))
    value = timing_of(headers)
    assert value.startswith("db;dur=7.5, app;dur=") and "tuna-rq;dur=" in value
    assert parse_server_timing(value) == pytest.approx(0.0075)          # the metric read by default is the app's
    lab = "app;dur=1.000, cpu;dur=1.000, tuna-rq;dur=0.000"
    _, headers, _ = call(SchedTiming(busy_app([("Server-Timing", lab)])))
    assert timing_of(headers) == lab                                     # the lab server's own: not timed twice


def test_post_worker_init_wraps_once_and_the_variable_turns_it_off(monkeypatch):
    app = busy_app()
    worker = SimpleNamespace(wsgi=app)
    hooks.time_requests(worker)
    hooks.time_requests(worker)
    assert isinstance(worker.wsgi, SchedTiming) and worker.wsgi.app is app
    monkeypatch.setenv("TUNA_LAB_SERVER_TIMING", "0")
    plain = SimpleNamespace(wsgi=app)
    hooks.time_requests(plain)
    assert plain.wsgi is app
    _, headers, _ = call(plain.wsgi)
    assert not [k for k, _ in headers if k.lower() == "server-timing"]
