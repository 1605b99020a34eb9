"""Tests of tuna_lab.measure.loadgen.load against in-test aiohttp endpoints on 127.0.0.1.

No assertion here is about speed (see bench/load_bench.py); timing enters
only through relations that hold by construction, e.g. a server that serves
one request per 50 ms makes the 30th of a burst wait far longer than 50 ms.
"""

import asyncio
import json
import os
import socket
import threading
import time

import numpy as np
import pandas as pd
import pytest
from aiohttp import web
from scipy import stats

from tuna_lab.errors import LoadError, TunaError
from tuna_lab.measure.loadgen import load, wire
from tuna_lab.measure.loadgen.load import (COLUMNS, aclosed_loop, aopen_loop, closed_loop,
                                   measure_generator, open_loop, payload, poisson_schedule, summary)
from tuna_lab.server.models import STAGES

# alone: it measures the load generator's latency and rate (tests/conftest.py)
pytestmark = pytest.mark.alone

SERVICE = 0.05  # seconds per request of the /slow endpoint


class Endpoint:
    """A server-like aiohttp app in its own thread and event loop.

    ``/predict`` answers like the inference server after 50 ms (requests
    overlap), ``/slow`` serves one request at a time in 50 ms, ``/flaky``
    answers 400 to every third request, ``/hang`` never answers (until
    teardown), ``/stall`` answers at once but blocks the whole server for
    200 ms at its ``stall_at``-th request, ``/chunked`` answers in chunks.
    It counts requests in flight (queued ones included), keeps every body it
    received and the client ports it saw.
    """

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner, self.port = self._call(self._start())
        self.url = f"http://127.0.0.1:{self.port}"
        self.reset()

    def reset(self):
        self.in_flight = self.max_in_flight = self.count = 0
        self.bodies, self.ports = [], set()
        self.stall_at, self.stalled_at = None, None

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _start(self):
        self.lock, self.release = asyncio.Lock(), asyncio.Event()
        app = web.Application(client_max_size=4 * 1024 * 1024)  # the large-body test sends 3 MB
        for path in ("predict", "slow", "flaky", "hang", "stall", "chunked"):
            app.router.add_post(f"/{path}", getattr(self, f"_{path}"))
        # Cancel a handler whose client went away, so one test's queue never delays the next.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner, runner.addresses[0][1]

    def _answer(self):
        stages = {name: 0.001 * (k + 1) for k, name in enumerate(STAGES)}
        return web.json_response({"count": 1, "stages": stages, "server_seconds": 0.02, "pid": os.getpid()})

    async def _enter(self, request):
        self.bodies.append(await request.read())
        self.ports.add(request.transport.get_extra_info("peername")[1])
        self.count += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return self.count

    async def _predict(self, request):
        await self._enter(request)
        try:
            await asyncio.sleep(SERVICE)
            return self._answer()
        finally:
            self.in_flight -= 1

    async def _slow(self, request):
        await self._enter(request)
        try:
            async with self.lock:
                await asyncio.sleep(SERVICE)
            return self._answer()
        finally:
            self.in_flight -= 1

    async def _flaky(self, request):
        n = await self._enter(request)
        self.in_flight -= 1
        if n % 3 == 0:
            return web.json_response({"error": "bad rows\nsecond line"}, status=400)
        return self._answer()

    async def _hang(self, request):
        await self._enter(request)
        try:
            await asyncio.wait_for(self.release.wait(), 20)
            return self._answer()
        finally:
            self.in_flight -= 1

    async def _stall(self, request):
        n = await self._enter(request)
        self.in_flight -= 1
        if n == self.stall_at:
            self.stalled_at = time.monotonic()
            time.sleep(0.2)  # blocks the event loop: nothing is served meanwhile
        return self._answer()

    async def _chunked(self, request):
        await self._enter(request)
        self.in_flight -= 1
        text = self._answer().body
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        resp.content_type = "application/json"
        await resp.prepare(request)
        for k in range(0, len(text), 7):
            await resp.write(text[k:k + 7])
        await resp.write_eof()
        return resp

    def close(self):
        self.loop.call_soon_threadsafe(self.release.set)
        self._call(self.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def endpoint():
    ep = Endpoint()
    yield ep
    ep.close()


@pytest.fixture
def server(endpoint):
    endpoint.reset()
    return endpoint


@pytest.fixture(scope="module")
def body():
    return payload("small", 4)


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- payload and schedule ----------------------------------------------------------------

def test_payload_is_the_json_body_of_make_rows():
    from tuna_lab.server.models import make_rows

    body = payload("small", 3, seed=2)
    assert isinstance(body, bytes)
    rows = json.loads(body)["rows"]
    assert np.array_equal(np.array(rows), make_rows("small", 3, seed=2))
    assert payload("small", 3, seed=2) == body != payload("small", 3, seed=3)


def test_poisson_schedule_is_reproducible_with_mean_gap_one_over_rate():
    rate = 250.0
    at = poisson_schedule(rate, requests=2001, seed=7)
    assert len(at) == 2001 and at[0] == 0.0 and np.all(np.diff(at) > 0)
    assert np.array_equal(at, poisson_schedule(rate, requests=2001, seed=7))
    assert not np.array_equal(at, poisson_schedule(rate, requests=2001, seed=8))
    gaps = np.diff(at)
    # 2000 exponential gaps: the mean is within 10 % of 1/rate (~4.5 standard errors)...
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.10)
    # ...and they are exponential (coefficient of variation 1), not evenly spaced.
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.15)
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 1e-3


def test_poisson_schedule_bounds_by_duration_and_count():
    by_time = poisson_schedule(100.0, duration=2.0, seed=1)
    assert by_time.max() < 2.0 and 100 < len(by_time) < 300
    # The same seed gives the same arrivals whichever bound cuts them.
    assert np.array_equal(by_time, poisson_schedule(100.0, requests=len(by_time), seed=1))
    assert len(poisson_schedule(100.0, requests=5, duration=100.0)) == 5
    assert len(poisson_schedule(1.0, requests=1000, duration=0.5)) == 1


# -- closed loop -------------------------------------------------------------------------

def test_closed_loop_rows_columns_and_concurrency(server, body):
    frame = closed_loop(server.url + "/predict", body, requests=20, concurrency=4)
    assert list(frame.columns) == list(COLUMNS)
    assert len(frame) == 20 and frame["request"].tolist() == list(range(20))
    assert (frame["status"] == 200).all() and (frame["error"] == "").all()
    assert (frame["pid"] == os.getpid()).all()
    assert frame["server_seconds"].eq(0.02).all()
    assert np.allclose(frame[list(STAGES)].to_numpy(), 0.001 * np.arange(1, 6))
    assert (frame["client_seconds"] > 0).all()
    assert frame["scheduled_at"].equals(frame["sent_at"]) and (frame["send_lag"] == 0).all()
    assert server.max_in_flight == 4
    assert server.bodies == [body] * 20


def test_closed_loop_default_sends_all_at_once(server, body):
    frame = closed_loop(server.url + "/predict", body, requests=12)
    assert (frame["status"] == 200).all()
    assert server.max_in_flight == 12


def test_async_variant_and_call_from_a_running_loop(server, body):
    url = server.url + "/predict"

    async def inside_a_loop():
        awaited = await aclosed_loop(url, body, requests=3)
        # A running loop (as in Jupyter): the sync call runs its own loop in a worker thread.
        blocking = closed_loop(url, body, requests=3)
        opened = await aopen_loop(url, body, rate=50.0, requests=3)
        return awaited, blocking, opened

    for frame in asyncio.run(inside_a_loop()):
        assert (frame["status"] == 200).all() and len(frame) == 3


# -- failures are rows -------------------------------------------------------------------

def test_error_status_rows_keep_the_servers_error(server, body):
    frame = closed_loop(server.url + "/flaky", body, requests=9, concurrency=1)
    bad = frame["status"] == 400
    assert bad.tolist() == [False, False, True] * 3
    # The server's own reason, after what was sent (a 4xx says what the request was).
    assert frame.loc[bad, "error"].str.match(r"HTTP 400 to POST, Content-Type application/json, a \d+-byte body: "
                                             r"bad rows second line$").all(), frame.loc[bad, "error"].tolist()
    assert frame.loc[bad, ["server_seconds", *STAGES]].isna().all().all()
    assert (frame.loc[bad, "pid"] == -1).all() and frame.loc[bad, "client_seconds"].notna().all()
    assert (frame.loc[~bad, "error"] == "").all()
    s = summary(frame)
    assert (s["n"], s["ok"], s["failed"]) == (9, 6, 3)


def test_closed_port_gives_client_side_failure_rows(body):
    frame = closed_loop(f"http://127.0.0.1:{_closed_port()}/predict", body, requests=3, timeout=5.0)
    assert (frame["status"] == -1).all()
    assert frame["error"].str.contains("connect", case=False).all()
    assert frame["client_seconds"].notna().all() and frame["server_seconds"].isna().all()
    assert summary(frame)["ok"] == 0


def test_deadline_bounds_a_hung_endpoint(server, body):
    start = time.monotonic()
    frame = closed_loop(server.url + "/hang", body, requests=4, timeout=60.0, deadline=0.5)
    assert time.monotonic() - start < 30  # a hang guard, not a performance check
    assert (frame["status"] == -1).all() and (frame["error"] == "deadline").all()
    # Each request was sent, so its latency is known to be at least up to the cut.
    assert (frame["client_seconds"] > 0).all()

    frame = open_loop(server.url + "/hang", body, rate=100.0, requests=4, timeout=60.0, deadline=0.5)
    assert (frame["error"] == "deadline").all()


def test_deadline_cuts_requests_never_sent(server, body):
    frame = closed_loop(server.url + "/hang", body, requests=6, concurrency=2, timeout=60.0, deadline=0.3)
    assert (frame["error"] == "deadline").all()
    unsent = frame["sent_at"].isna()
    assert unsent.sum() == 4 and frame.loc[unsent, "client_seconds"].isna().all()


def test_the_collector_is_off_during_a_trial_and_as_it_was_after(server, body):
    # A full collection in a large process held the GIL for tens of ms mid-trial: the generator pauses it.
    import gc
    seen = []
    timer = threading.Timer(0.06, lambda: seen.append(gc.isenabled()))   # mid-trial: 3 x 50 ms, one at a time
    timer.start()
    closed_loop(server.url + "/slow", body, requests=3, concurrency=3)
    timer.join()
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        closed_loop(server.url + "/predict", body, requests=2)
        assert not gc.isenabled()   # off before the trial: left off
    finally:
        gc.enable()


def test_request_timeout(server, body):
    frame = closed_loop(server.url + "/hang", body, requests=2, timeout=0.2, deadline=10.0)
    assert (frame["status"] == -1).all() and (frame["error"] == "timeout").all()


# -- open loop ---------------------------------------------------------------------------

def test_open_loop_measures_from_schedule_on_a_slow_server(server, body):
    rate, n = 100.0, 30  # five times what one request per 50 ms can serve
    frame = open_loop(server.url + "/slow", body, rate=rate, requests=n, seed=3, timeout=20.0)
    assert list(frame.columns) == list(COLUMNS) and (frame["status"] == 200).all()
    # Arrivals follow the schedule, not the responses...
    assert np.array_equal(frame["scheduled_at"].to_numpy(), poisson_schedule(rate, requests=n, seed=3))
    assert server.max_in_flight > 5
    lag = frame["send_lag"].to_numpy()
    assert np.all(np.isfinite(lag)) and np.all(lag >= 0)
    assert np.allclose(frame["sent_at"] - frame["scheduled_at"], lag)
    # ...so the queue shows in the latency: served one at a time, the later
    # requests wait for the earlier ones, far beyond one service time.
    latency = frame["client_seconds"].to_numpy()
    assert latency[-10:].mean() > 5 * SERVICE
    assert latency[-10:].mean() > 3 * latency[:3].mean()
    # Latency counts from the schedule: it is the time after sending plus the lag.
    assert np.all(latency >= lag)


def test_open_loop_duration_bound(server, body):
    frame = open_loop(server.url + "/predict", body, rate=40.0, duration=0.5, seed=2)
    assert np.array_equal(frame["scheduled_at"].to_numpy(), poisson_schedule(40.0, duration=0.5, seed=2))
    assert (frame["status"] == 200).all()


def test_max_in_flight_bounds_open_loop(server, body):
    frame = open_loop(server.url + "/predict", body, rate=200.0, requests=20, max_in_flight=2)
    assert (frame["status"] == 200).all()
    assert server.max_in_flight <= 2


# -- summary and search ------------------------------------------------------------------

def test_summary_matches_numpy_on_the_raw_frame(server, body):
    frame = closed_loop(server.url + "/flaky", body, requests=12, concurrency=3)
    s = summary(frame)
    ok = frame[(frame["status"] == 200) & (frame["error"] == "")]
    for col, prefix in (("server_seconds", "server"), ("client_seconds", "client")):
        values = ok[col].to_numpy()
        for q in (50, 95, 99):
            assert s[f"{prefix}_p{q}"] == np.percentile(values, q)
        assert s[f"{prefix}_mean"] == pytest.approx(values.mean())
    wall = (frame["scheduled_at"] + frame["client_seconds"]).max()
    assert s["wall_seconds"] == wall and s["throughput"] == pytest.approx(len(ok) / wall)
    assert s["send_lag_p99"] == 0 and s["send_lag_max"] == 0


def test_summary_of_a_hand_built_frame():
    n = 5
    frame = pd.DataFrame({c: np.zeros(n) for c in COLUMNS})
    frame["error"] = ["", "", "boom", "", ""]
    frame["status"] = [200, 200, -1, 200, 500]
    frame["client_seconds"] = [0.1, 0.2, np.nan, 0.4, 0.3]
    frame["server_seconds"] = [0.01, 0.02, np.nan, 0.04, np.nan]
    frame["scheduled_at"] = [0.0, 0.1, 0.2, 0.3, 0.4]
    frame["send_lag"] = [0.0, 0.001, np.nan, 0.002, 0.004]
    s = summary(frame)
    assert (s["n"], s["ok"], s["failed"]) == (5, 3, 2)
    assert s["client_p50"] == 0.2 and s["client_p99"] == np.percentile([0.1, 0.2, 0.4], 99)
    assert s["wall_seconds"] == pytest.approx(0.7) and s["throughput"] == pytest.approx(3 / 0.7)
    assert s["send_lag_max"] == 0.004 and s["send_lag_p99"] == np.percentile([0, 0.001, 0.002, 0.004], 99)
    with pytest.raises(LoadError, match="missing columns"):
        summary(frame.drop(columns="pid"))


def test_measure_generator_runs_and_stops_its_endpoint():
    threads = threading.active_count()
    result = measure_generator(rate=100.0, duration=0.3, requests_closed=50, concurrency=4)
    assert result["closed_failed"] == 0 and result["open_failed"] == 0
    assert result["closed_rps"] > 0 and result["send_lag_p99"] >= 0
    assert threading.active_count() == threads


# -- the generator's own cost and CPUs --------------------------------------------------

def _affinities():
    """``{tid: cpulist}`` of every thread of this process, from /proc."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as fh:
                text = fh.read()
        except FileNotFoundError:
            continue  # a thread that just ended
        out[int(tid)] = text.split("Cpus_allowed_list:")[1].split()[0]
    return out


def test_every_frame_carries_the_generators_cost(server, body):
    closed = closed_loop(server.url + "/predict", body, requests=20, concurrency=4)
    opened = open_loop(server.url + "/predict", body, rate=100.0, requests=20)
    for frame in (closed, opened):
        cost = frame.attrs["generator"]
        assert set(cost) == set(load.GENERATOR_KEYS)
        assert json.loads(json.dumps(cost)) == cost  # plain JSON, as a manifest stores it
        assert cost["cpu_seconds"] > 0 and cost["cpu_user"] >= 0 and cost["cpu_sys"] >= 0
        assert cost["cpu_seconds"] == pytest.approx(cost["cpu_user"] + cost["cpu_sys"])
        assert cost["cpus"] == sorted(os.sched_getaffinity(0))
        assert cost["processes"] == 1 and cost["requests"] == 20
        # The trial's own CPU, not the process's: far below the wall time of 20 x 50 ms waits.
        assert 0 < cost["cpu_seconds"] < cost["wall_seconds"]


@pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1")
def test_cpus_pin_the_generator_for_the_trial_only(server, body):
    before = _affinities()
    threads = threading.active_count()
    seen, result = [], {}

    def trial():
        result["frame"] = closed_loop(server.url + "/predict", body, requests=12, concurrency=1, cpus=[1])

    runner = threading.Thread(target=trial)
    runner.start()
    while runner.is_alive():
        seen.append(_affinities())
        time.sleep(0.01)
    runner.join()
    # While it ran, exactly one new thread (the generator) ran on CPU 1 alone...
    pinned = {tid for snapshot in seen for tid, cpus in snapshot.items() if cpus == "1"}
    assert len(pinned) == 1 and not pinned & set(before)
    frame = result["frame"]
    assert (frame["status"] == 200).all() and frame.attrs["generator"]["cpus"] == [1]
    # ...and it is gone: no thread is left pinned, and the others were never touched.
    after = _affinities()
    assert not pinned & set(after)
    assert all(after[tid] == cpus for tid, cpus in before.items() if tid in after)
    assert threading.active_count() == threads
    # A cpulist string works too.
    assert open_loop(server.url + "/predict", body, rate=50.0, requests=3, cpus="0").attrs["generator"]["cpus"] == [0]


@pytest.mark.parametrize("cpus, match", [([], "at least one"), ([100_000], "not allowed"), ([-1], "cpus"),
                                         ([True], "cpus"), ("0-x", "cpulist"), (3, "iterable")])
def test_bad_cpus_raise_one_line(cpus, match, body):
    with pytest.raises(LoadError, match=match) as info:
        closed_loop(f"http://127.0.0.1:{_closed_port()}/predict", body, requests=1, cpus=cpus)
    assert "\n" not in str(info.value)


# -- open-loop latency is measured from the schedule ----------------------------------------

def test_a_server_stall_shows_in_the_open_loop_p99(server, body):
    # The server stops serving for 200 ms at its 10th request. The generator
    # keeps sending on schedule, and every request due in the stall waits for
    # its end: their latency, from the scheduled time, holds the stall.
    server.stall_at = 10
    rate, n = 50.0, 60
    frame = open_loop(server.url + "/stall", body, rate=rate, requests=n, seed=4, timeout=10.0)
    assert (frame["status"] == 200).all() and server.stalled_at is not None
    s = summary(frame)
    assert s["client_p99"] >= 0.15 and frame["client_seconds"].max() >= 0.19
    # Without the stall all would be fast: the median stays well below it.
    assert s["client_p50"] < 0.1
    # The sends were not held back by the stalled server (no coordinated omission)...
    assert frame["send_lag"].max() < 0.05
    # ...and the stalled request waited out the whole stall.
    late = frame["client_seconds"] >= 0.19
    assert late.sum() >= 1 and frame.loc[late, "send_lag"].max() < 0.05


# -- the wire ----------------------------------------------------------------------------

def test_connections_are_kept_alive(server, body):
    frame = closed_loop(server.url + "/predict", body, requests=20, concurrency=2)
    assert (frame["status"] == 200).all()
    assert len(server.ports) == 2  # two connections carried the 20 requests


def test_reuse_bounds_the_requests_a_connection_carries(server, body):
    # Reconnecting is what lets a server whose workers share one listening socket hand the load to each.
    frame = closed_loop(server.url + "/predict", body, requests=20, concurrency=2, reuse=4)
    assert (frame["status"] == 200).all()
    # At most 4 requests a connection: at least 5 of them, and a sixth where the two in flight ended unevenly.
    assert 5 <= len(server.ports) <= 6
    assert frame.attrs["reuse"] == 4
    server.reset()
    frame = open_loop(server.url + "/predict", body, rate=200, requests=12, max_in_flight=1, reuse=3)
    assert (frame["status"] == 200).all() and len(server.ports) == 4      # one at a time: 3 each


def test_chunked_responses_are_parsed(server, body):
    frame = closed_loop(server.url + "/chunked", body, requests=6, concurrency=2)
    assert (frame["status"] == 200).all() and (frame["error"] == "").all()
    assert frame["server_seconds"].eq(0.02).all() and (frame["pid"] == os.getpid()).all()


def test_a_large_body_is_sent_whole(server):
    big = b'{"rows": [[' + b"0.0," * 750_000 + b'0.0]]}'
    frame = closed_loop(server.url + "/predict", big, requests=3, concurrency=3)
    assert (frame["status"] == 200).all()
    assert server.bodies == [big] * 3


@pytest.mark.parametrize("raw, eof, expected", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", False, (200, b"ok", 40, True)),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", False, (200, b"ok", 59, False)),
    (b"HTTP/1.0 404 Not Found\r\nContent-Length: 1\r\n\r\nx", False, (404, b"x", 46, False)),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nok", False, (200, None, 43, True)),
    (b"HTTP/1.1 200 OK\r\nContent-Le", False, None),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", False, (204, b"", 52, True)),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n", False,
     (200, b"abcde", 71, True)),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab", False, (200, None, -1, True)),
    (b"HTTP/1.1 200 OK\r\n\r\nto the end", False, (200, None, -1, False)),
    (b"HTTP/1.1 200 OK\r\n\r\nto the end", True, (200, b"to the end", 29, False)),
    # Connection read in place (Gunicorn's spelling), in other cases and spellings, and last in the block.
    (b"HTTP/1.1 200 OK\r\nCONNECTION: Close\r\nContent-Length: 2\r\n\r\nok", False, (200, b"ok", 59, False)),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok", False, (200, b"ok", 59, False)),
    (b"HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\n\r\n", True, (200, b"", 50, False)),
    (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok", False, (200, b"ok", 64, True)),
    # The status line read by position (no reason phrase); a bytearray buffer still gives a bytes body.
    (b"HTTP/1.1 201\r\nContent-Length: 0\r\n\r\n", False, (201, b"", 35, True)),
    (bytearray(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"), False, (200, b"ok", 40, True)),
])
def test_parse_response(raw, eof, expected):
    assert wire.parse_response(raw, eof) == expected
    # A response is incomplete until its last byte.
    if expected and expected[1] is not None and not eof:
        partial = wire.parse_response(raw[:-1])
        assert partial is None or partial[1] is None
    if expected and expected[1] is not None:
        assert type(wire.parse_response(raw, eof)[1]) is bytes


@pytest.mark.parametrize("raw", [b"HTTP/2 200 OK\r\n\r\n", b"HTTP/1.1 20 OK\r\n\r\n", b"HTTP/1.1 2000\r\n\r\n",
                                 b"ICY 200 OK\r\n\r\n", b"HTTP/1.1 200\nX: y\r\n\r\n", b"HTTP/1.1  200 OK\r\n\r\n"])
def test_a_malformed_status_line_is_refused(raw):
    with pytest.raises(ValueError, match="not an HTTP/1.x status line"):
        wire.parse_response(raw)


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 200 OK\r\nServer: gunicorn\r\nConnection: close\r\nContent-Length: 12\r\n\r\n{\"count\": 1}",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabc",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n",
])
def test_parse_response_at_every_cut(raw):
    # However the bytes arrive, a response is complete exactly when its last byte is in,
    # and bytes after it (the next response on a kept-alive connection) are not its own.
    status, body, end, _ = wire.parse_response(raw)
    assert end == len(raw) and status == 200
    for cut in range(len(raw)):
        partial = wire.parse_response(raw[:cut])
        assert partial is None or partial[1] is None
    assert wire.parse_response(raw + b"HTTP/1.1 500 X\r\n")[1:3] == (body, end)


@pytest.mark.parametrize("raw, eof, match", [
    (b"SPDY/3 200 OK\r\n\r\n", False, "status line"),
    (b"HTTP/1.1 2x0 OK\r\n\r\n", False, "status line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", False, "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", False, "chunk size"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort", True, "closed"),
    (b"HTTP/1.1 200 OK\r\nContent", True, "closed"),
])
def test_parse_response_refuses_malformed(raw, eof, match):
    with pytest.raises(ValueError, match=match):
        wire.parse_response(raw, eof)


# -- refused input -----------------------------------------------------------------------

@pytest.mark.parametrize("url", ["http://10.0.0.1/predict", "http://example.com/", "http://[2001:db8::1]:80/",
                                 "http://0.0.0.0:80/", "ftp://127.0.0.1/", "127.0.0.1:8000/predict",
                                 "http://127.0.0.1:notaport/", "https://127.0.0.1:443/"])
def test_non_loopback_url_is_refused_before_sending(monkeypatch, url, body):
    def no_network(*args, **kwargs):
        raise AssertionError("the generator was started")

    # Resolving the host and driving the trial are the only ways to a socket.
    monkeypatch.setattr(load, "resolve", no_network)
    monkeypatch.setattr(load, "drive", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    for call in (lambda: closed_loop(url, body, requests=1), lambda: open_loop(url, body, 10.0, requests=1)):
        with pytest.raises(LoadError) as info:
            call()
        assert "\n" not in str(info.value)


def test_loopback_hosts_are_accepted(server, body):
    port = server.port
    for host in ("localhost", "127.0.0.1"):
        assert (closed_loop(f"http://{host}:{port}/predict", body, requests=2)["status"] == 200).all()
    # Another loopback address or ::1 passes the check (here nothing listens there).
    for url in (f"http://127.0.0.2:{_closed_port()}/", f"http://[::1]:{_closed_port()}/"):
        assert (closed_loop(url, body, requests=1, timeout=5.0)["status"] == -1).all()


@pytest.mark.parametrize("call, match", [
    (lambda url, body: open_loop(url, body, rate=0, requests=5), "rate"),
    (lambda url, body: open_loop(url, body, rate=-3.0, duration=1.0), "rate"),
    (lambda url, body: open_loop(url, body, rate=float("nan"), duration=1.0), "rate"),
    (lambda url, body: open_loop(url, body, rate=10.0), "requests and/or duration"),
    (lambda url, body: closed_loop(url, body, requests=0), "requests"),
    (lambda url, body: closed_loop(url, body, requests=True), "requests"),
    (lambda url, body: closed_loop(url, body, requests=5, concurrency=0), "concurrency"),
    (lambda url, body: closed_loop(url, body, requests=5, timeout=-1), "timeout"),
    (lambda url, body: closed_loop(url, {"rows": []}), "body"),
    (lambda url, body: poisson_schedule(1e9, duration=1e9), "limit"),
])
def test_bad_input_raises_one_line(call, match, body):
    with pytest.raises(LoadError, match=match) as info:
        call(f"http://127.0.0.1:{_closed_port()}/predict", body)
    assert isinstance(info.value, TunaError) and "\n" not in str(info.value)


def test_too_many_connections_for_the_fd_limit(monkeypatch, body):
    monkeypatch.setattr(load.resource, "getrlimit", lambda _: (100, 100))
    with pytest.raises(LoadError, match="ulimit"):
        closed_loop(f"http://127.0.0.1:{_closed_port()}/", body, requests=1000)
