"""Load generation against the inference server: closed and open (Poisson) loops.

Two ways to load a server, after the article and the usual "p99 latency vs
QPS" method of measuring service throughput at bounded latency:

* **closed loop** (:func:`closed_loop`) - the article's "1,000 concurrent
  requests": ``requests`` requests, at most ``concurrency`` in flight, each
  worker sending its next request when the previous one returns. Measures
  the best throughput, but the offered load adapts to the server.
* **open loop** (:func:`open_loop`) - requests arrive at ``rate`` per second
  with Poisson (exponential) inter-arrival times, whatever the server does.
  Latency is measured from each request's *scheduled* send time, so a
  stalled server or generator cannot hide its queueing delay ("coordinated
  omission"); ``send_lag`` shows how late the generator actually sent.

:func:`bounded_throughput` searches the highest Poisson rate whose p99
latency stays within an SLA ("throughput with bounded latency"), and
:func:`measure_generator` measures the generator itself against a trivial
in-process endpoint.

Every trial returns one row per request (:data:`COLUMNS`, the same tuple as
:data:`tuna_lab.measure.schema.REQUEST_COLUMNS`); failures are rows
(``status`` -1 for client-side failures), never exceptions. Only loopback
targets (127.0.0.0/8, ``localhost``, ``::1``) are accepted, redirects are not
followed, proxies from the environment are ignored, and every trial is
bounded in request count and wall time.

The functions are synchronous (they run their own event loop). Called from
a thread that already runs an event loop (a Jupyter cell), they run their
loop in a worker thread and block until it is done; there, ``await
aclosed_loop(...)`` / ``await aopen_loop(...)`` avoid blocking the kernel.

Examples
--------
>>> from tuna_lab.measure.load import payload, closed_loop, summary
>>> body = payload("small", 100)
>>> frame = closed_loop(srv.url + "/predict", body, requests=200)   # doctest: +SKIP
>>> summary(frame)["client_p99"]   # doctest: +SKIP
0.41
"""

import asyncio
import concurrent.futures
import contextlib
import ipaddress
import json
import math
import os
import resource
from urllib.parse import urlsplit

import aiohttp
import numpy as np
import pandas as pd
from aiohttp import web

from .._checks import positive_int, positive_number, shorten
from ..errors import LoadError
from ..server.models import STAGES, make_rows
from .schema import LATE_REQUEST_COLUMNS, percentiles
# The columns of a trial's frame (one row per request, documented in
# tuna_lab.measure.schema), under the name this module has always given them.
from .schema import REQUEST_COLUMNS as COLUMNS

__all__ = [
    "COLUMNS",
    "payload",
    "poisson_schedule",
    "closed_loop",
    "aclosed_loop",
    "open_loop",
    "aopen_loop",
    "summary",
    "bounded_throughput",
    "measure_generator",
]

_HEADERS = {"Content-Type": "application/json"}
# Status of a request that has not finished (yet); never appears in a frame.
_PENDING = -2
# An upper bound on a schedule, so a typo in rate * duration cannot exhaust memory.
_MAX_REQUESTS = 10_000_000
# File descriptors left for everything but the trial's sockets.
_FD_RESERVE = 64
# How early the open loop's dispatcher wakes before a send time (see _sleep_until).
_SPIN = 0.0005
# Longest error text kept in a request's row.
_ERROR_CHARS = 200


# -- input checks ------------------------------------------------------------------------

def _loopback_url(url):
    """Return ``url`` if it is an http(s) URL whose host is a loopback address, else raise."""
    if not isinstance(url, str):
        raise LoadError(f"url must be a string, got {url!r}")
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as exc:
        raise LoadError(f"malformed url {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise LoadError(f"url must be http(s)://host[:port]/path, got {url!r}")
    if host == "localhost":
        return url
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        # Load tests only ever target a local server: refuse before any socket is opened.
        raise LoadError(f"refusing to load {host!r}: only loopback hosts (127.0.0.0/8, localhost, ::1) are allowed")
    return url


def _body_bytes(body):
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise LoadError(f"body must be bytes (see payload()), got {type(body).__name__}")


def _check_fds(connections):
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and connections + _FD_RESERVE > soft:
        raise LoadError(f"{connections} connections need more file descriptors than the limit of {soft}; "
                        "lower the concurrency or raise `ulimit -n`")


# -- payload and schedule ----------------------------------------------------------------

def payload(model, batch, seed=0):
    """The JSON body of a ``POST /predict``: ``batch`` rows of ``model``, encoded once.

    Build it once per trial and send the same bytes with every request, so
    the generator spends no time encoding while it measures.

    Parameters
    ----------
    model : {"small", "medium", "large"}
    batch : int
        Rows per request.
    seed : int
        Seed of :func:`tuna_lab.server.models.make_rows`.

    Returns
    -------
    bytes

    Examples
    --------
    >>> body = payload("small", 2)
    >>> len(json.loads(body)["rows"][0])
    29
    """
    rows = make_rows(model, batch, seed)
    return json.dumps({"rows": rows.tolist()}, separators=(",", ":")).encode()


def poisson_schedule(rate, requests=None, duration=None, seed=0):
    """Send times (seconds from the trial's start) of a Poisson arrival process.

    Inter-arrival times are exponential with mean ``1 / rate``, drawn from
    ``numpy.random.default_rng(seed)``; the first request is sent at 0. The
    same seed gives the same arrivals, and the same pattern scaled by
    ``1 / rate`` at every rate (common random numbers for rate sweeps).

    Parameters
    ----------
    rate : float
        Mean arrivals per second.
    requests : int, optional
        At most this many arrivals.
    duration : float, optional
        Only arrivals before ``duration`` seconds. At least one of
        ``requests`` and ``duration`` is required.
    seed : int

    Returns
    -------
    numpy.ndarray of float

    Examples
    --------
    >>> at = poisson_schedule(100.0, requests=2000, seed=1)
    >>> len(at), float(at[0]), round(float(np.diff(at).mean()), 2)
    (2000, 0.0, 0.01)
    """
    rate = positive_number("rate", rate, LoadError)
    if requests is None and duration is None:
        raise LoadError("give requests and/or duration: an open loop must be bounded")
    if requests is not None:
        requests = positive_int("requests", requests, LoadError)
    if duration is not None:
        duration = positive_number("duration", duration, LoadError)
    if requests is None:
        # Expected count plus 8 standard deviations: one draw nearly always suffices.
        expected = rate * duration
        if expected > _MAX_REQUESTS:
            raise LoadError(f"rate * duration = {expected:.0f} requests exceeds the limit of {_MAX_REQUESTS}")
        want = int(expected + 8 * math.sqrt(expected) + 16)
    else:
        if requests > _MAX_REQUESTS:
            raise LoadError(f"{requests} requests exceed the limit of {_MAX_REQUESTS}")
        want = requests - 1
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, want)
    # Successive draws continue one stream, so a longer schedule extends a shorter one.
    while requests is None and gaps.sum() < duration:
        gaps = np.concatenate((gaps, rng.exponential(1.0 / rate, want)))
    at = np.concatenate(([0.0], np.cumsum(gaps)))
    if requests is not None:
        at = at[:requests]
    if duration is not None:
        at = at[at < duration]
    return at


# -- per-request records -----------------------------------------------------------------

class _Records:
    """Column arrays of a trial, written in place by the request coroutines."""

    def __init__(self, n, scheduled=None):
        self.status = np.full(n, _PENDING, dtype=np.int64)
        self.error = np.full(n, "", dtype=object)
        self.sent = np.full(n, np.nan)
        self.done = np.full(n, np.nan)
        # Closed mode has no schedule: filled with the send time as requests go out.
        self.scheduled = np.full(n, np.nan) if scheduled is None else np.asarray(scheduled, dtype=float)
        self.server = np.full((n, 1 + len(STAGES)), np.nan)
        self.pid = np.full(n, -1, dtype=np.int64)
        # When the worker began the request, on the machine-wide monotonic clock
        # (CLOCK_MONOTONIC): lets CPU samples be split into busy and idle time.
        self.start = np.full(n, np.nan)
        # CPU seconds the worker's main thread and OpenMP pool spent on the request.
        self.cpu = np.full((n, 2), np.nan)
        # Response bodies, decoded only after the trial: keeps the event loop's
        # per-request work (and so the generator's own delay) as small as possible.
        self.raw = np.full(n, b"", dtype=object)

    def cut(self, at):
        """Mark every unfinished request as cut by the trial's deadline at ``at`` seconds."""
        pending = self.status == _PENDING
        self.status[pending] = -1
        self.error[pending] = "deadline"
        # A lower bound on their latency; requests not yet due get none.
        due = pending & (self.scheduled <= at)
        self.done[due] = at

    def frame(self, attrs):
        for i in np.flatnonzero(self.status == 200):
            _parse_ok(self, i, self.raw[i])
        for i in np.flatnonzero(self.status > 0):
            if self.status[i] != 200:
                self.error[i] = _error_text(self.raw[i], self.status[i])
        n = len(self.status)
        data = {"request": np.arange(n), "status": self.status, "error": self.error,
                "client_seconds": self.done - self.scheduled, "server_seconds": self.server[:, 0]}
        data.update({name: self.server[:, k + 1] for k, name in enumerate(STAGES)})
        data.update({"pid": self.pid, "sent_at": self.sent, "scheduled_at": self.scheduled,
                     "send_lag": self.sent - self.scheduled, "server_start": self.start,
                     "cpu_main": self.cpu[:, 0], "cpu_openmp": self.cpu[:, 1]})
        frame = pd.DataFrame(data, columns=list(COLUMNS))
        frame.attrs.update(attrs)
        return frame


def _error_text(raw, status):
    try:
        doc = json.loads(raw)
        if isinstance(doc, dict) and "error" in doc:
            return shorten(doc["error"], _ERROR_CHARS)
    except ValueError:
        pass
    text = shorten(raw.decode("utf-8", "replace"), _ERROR_CHARS)
    return text or f"HTTP {status}"


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return np.nan


def _parse_ok(rec, i, raw):
    """Fill the server-side columns of request ``i`` from a 200 body; fields it lacks stay NaN."""
    try:
        doc = json.loads(raw)
    except ValueError:
        rec.error[i] = "response is not JSON"
        return
    if not isinstance(doc, dict):
        rec.error[i] = "response is not a JSON object"
        return
    stages = doc.get("stages")
    stages = stages if isinstance(stages, dict) else {}
    rec.server[i] = [_number(doc.get("server_seconds")), *(_number(stages.get(k)) for k in STAGES)]
    rec.start[i] = _number(doc.get("started"))
    cpu = doc.get("cpu")
    if isinstance(cpu, dict):
        rec.cpu[i] = [_number(cpu.get("main")), _number(cpu.get("openmp"))]
    pid = doc.get("pid")
    if isinstance(pid, int) and not isinstance(pid, bool):
        rec.pid[i] = pid


async def _exchange(session, url, body, rec, i, clock, t0):
    """Send request ``i`` now and record its outcome; never raises but on cancellation.

    Only the status and raw body are kept here; :meth:`_Records.frame` parses them.
    """
    now = clock() - t0
    rec.sent[i] = now
    if np.isnan(rec.scheduled[i]):
        rec.scheduled[i] = now
    try:
        async with session.post(url, data=body, headers=_HEADERS, allow_redirects=False) as resp:
            raw = await resp.read()
            status = resp.status
    except TimeoutError:
        status, raw, error = -1, b"", "timeout"
    except Exception as exc:  # noqa: BLE001 - a client-side failure is a row, not the end of the trial
        status, raw, error = -1, b"", shorten(f"{type(exc).__name__}: {exc}", _ERROR_CHARS)
    else:
        error = ""
    rec.done[i] = clock() - t0
    rec.status[i] = status
    rec.raw[i] = raw
    if error:
        rec.error[i] = error


def _session(connections, timeout):
    # One pooled session, keep-alive, sized so no request waits for a connection;
    # no proxies or netrc from the environment, no cookie bookkeeping.
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=0)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout),
                                 trust_env=False, cookie_jar=aiohttp.DummyCookieJar())


async def _sleep_until(clock, target):
    # epoll waits in whole milliseconds, rounded up, so a timer wakes 0-1 ms
    # late. Aim _SPIN early, then yield to the loop without sleeping through
    # what is left: the send lag stays within ~_SPIN for ~_SPIN / 4 of
    # busy-yielding per request on average; a request never leaves early.
    while (remaining := target - clock()) > 0:
        await asyncio.sleep(remaining - _SPIN if remaining > _SPIN else 0)


def _run_sync(factory):
    """Run the coroutine made by ``factory()`` to completion and return its result.

    Without a running event loop this is :func:`asyncio.run`. Inside one (a
    Jupyter kernel), the caller expects a blocking call, and a second loop
    cannot run in the same thread: run it in a worker thread and wait.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tuna-load") as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


# -- closed loop -------------------------------------------------------------------------

async def aclosed_loop(url, body, requests=1000, concurrency=None, timeout=120.0, deadline=None):
    """Async variant of :func:`closed_loop`, for callers already in an event loop.

    Examples
    --------
    >>> frame = await aclosed_loop(url, body, requests=100)   # doctest: +SKIP
    """
    url, body = _loopback_url(url), _body_bytes(body)
    n = positive_int("requests", requests, LoadError)
    workers = n if concurrency is None else min(n, positive_int("concurrency", concurrency, LoadError))
    timeout = positive_number("timeout", timeout, LoadError)
    deadline = 2.0 * timeout if deadline is None else positive_number("deadline", deadline, LoadError)
    _check_fds(workers)

    rec = _Records(n)
    todo = iter(range(n))  # shared by the workers; next() is atomic on one event loop
    loop = asyncio.get_running_loop()
    clock = loop.time

    async def worker(session, t0):
        for i in todo:
            await _exchange(session, url, body, rec, i, clock, t0)

    async with _session(workers, timeout) as session:
        t0 = clock()
        try:
            async with asyncio.timeout(deadline):
                async with asyncio.TaskGroup() as group:
                    for _ in range(workers):
                        group.create_task(worker(session, t0))
        except TimeoutError:
            pass  # the unfinished requests become "deadline" rows below
        rec.cut(clock() - t0)
    return rec.frame({"mode": "closed", "url": url, "requests": n, "concurrency": workers,
                      "timeout": timeout, "deadline": deadline})


def closed_loop(url, body, requests=1000, concurrency=None, timeout=120.0, deadline=None):
    """Send ``requests`` requests with ``concurrency`` in flight; one row per request.

    The article's closed mode: by default all requests start at once
    ("1,000 concurrent requests"); with a smaller ``concurrency`` that many
    workers each send their next request when the previous one returns.

    Parameters
    ----------
    url : str
        A loopback URL, e.g. ``srv.url + "/predict"``.
    body : bytes
        The request body, e.g. from :func:`payload`; the same bytes every time.
    requests : int
    concurrency : int, optional
        Requests in flight (default: ``requests``, all at once).
    timeout : float
        Seconds each request may take before it fails with error ``"timeout"``.
    deadline : float, optional
        Wall-clock bound of the whole trial (default ``2 * timeout``); requests
        not finished by then get status -1 and error ``"deadline"``.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`COLUMNS`. ``client_seconds`` runs from send to full
        response; ``scheduled_at`` equals ``sent_at`` and ``send_lag`` is 0.
        Server-side columns are NaN unless ``status`` is 200; ``pid`` is -1
        when unknown. Times are seconds since the trial started.

    Examples
    --------
    >>> frame = closed_loop(srv.url + "/predict", payload("small", 100), requests=1000)   # doctest: +SKIP
    >>> frame["status"].eq(200).all()   # doctest: +SKIP
    True
    """
    return _run_sync(lambda: aclosed_loop(url, body, requests, concurrency, timeout, deadline))


# -- open loop ---------------------------------------------------------------------------

async def aopen_loop(url, body, rate, requests=None, duration=None, seed=0, timeout=30.0,
                     max_in_flight=1000, deadline=None):
    """Async variant of :func:`open_loop`, for callers already in an event loop.

    Examples
    --------
    >>> frame = await aopen_loop(url, body, rate=50, duration=2.0)   # doctest: +SKIP
    """
    url, body = _loopback_url(url), _body_bytes(body)
    at = poisson_schedule(rate, requests, duration, seed)
    timeout = positive_number("timeout", timeout, LoadError)
    slots = positive_int("max_in_flight", max_in_flight, LoadError)
    span = float(at[-1])
    deadline = span + timeout if deadline is None else positive_number("deadline", deadline, LoadError)
    _check_fds(min(slots, len(at)))

    rec = _Records(len(at), scheduled=at)
    # Bounds the sockets in use. A request waiting for a slot is sent late, and
    # its send_lag and client_seconds (from the schedule) include the wait.
    gate = asyncio.Semaphore(slots)
    loop = asyncio.get_running_loop()
    clock = loop.time

    async def one(session, i, t0):
        async with gate:
            await _exchange(session, url, body, rec, i, clock, t0)

    async with _session(min(slots, len(at)), timeout) as session:
        t0 = clock()
        try:
            async with asyncio.timeout(deadline):
                async with asyncio.TaskGroup() as group:
                    for i, offset in enumerate(at.tolist()):
                        await _sleep_until(clock, t0 + offset)
                        group.create_task(one(session, i, t0))
        except TimeoutError:
            pass
        rec.cut(clock() - t0)
    return rec.frame({"mode": "open", "url": url, "rate": float(rate), "seed": seed, "requests": len(at),
                      "duration": duration, "timeout": timeout, "max_in_flight": slots, "deadline": deadline})


def open_loop(url, body, rate, requests=None, duration=None, seed=0, timeout=30.0, max_in_flight=1000,
              deadline=None):
    """Send requests at ``rate`` per second with Poisson arrivals; one row per request.

    Arrivals follow :func:`poisson_schedule` and do not wait for responses.
    ``client_seconds`` runs from each request's *scheduled* time to its full
    response, so time a request spent queued behind a slow server - or behind
    a generator that fell behind - is counted (no coordinated omission);
    ``send_lag`` is how late it was actually sent.

    Parameters
    ----------
    url : str
        A loopback URL.
    body : bytes
        The request body, the same bytes every time.
    rate : float
        Mean requests per second.
    requests, duration : int, float, optional
        At most ``requests`` requests, scheduled before ``duration`` seconds;
        at least one is required.
    seed : int
        Seed of the arrival schedule.
    timeout : float
        Seconds each request may take once sent.
    max_in_flight : int
        Most requests (and sockets) in flight; later arrivals wait for a slot,
        which shows as ``send_lag``.
    deadline : float, optional
        Wall-clock bound of the trial (default: last arrival + ``timeout``).

    Returns
    -------
    pandas.DataFrame
        Columns :data:`COLUMNS`, as for :func:`closed_loop`.

    Examples
    --------
    >>> frame = open_loop(srv.url + "/predict", body, rate=50, duration=5.0)   # doctest: +SKIP
    >>> summary(frame)["send_lag_p99"] < 0.002   # doctest: +SKIP
    True
    """
    return _run_sync(lambda: aopen_loop(url, body, rate, requests, duration, seed, timeout, max_in_flight,
                                        deadline))


# -- analysis ----------------------------------------------------------------------------

def summary(frame):
    """Counts, latency percentiles, throughput and send lag of one trial.

    Percentiles (:func:`tuna_lab.measure.schema.percentiles`: linear, as
    :func:`numpy.percentile`) and means are over the ok rows (status 200, no
    error). ``throughput`` is ok requests divided by the
    trial's wall time, from its start to the last response or the deadline.

    Parameters
    ----------
    frame : pandas.DataFrame
        From :func:`closed_loop` or :func:`open_loop`.

    Returns
    -------
    dict
        ``n``, ``ok``, ``failed``, ``server_{p50,p95,p99,mean}``,
        ``client_{p50,p95,p99,mean}``, ``wall_seconds``, ``throughput``,
        ``send_lag_p99``, ``send_lag_max`` (seconds; NaN when undefined).

    Examples
    --------
    >>> summary(frame)["client_p99"]   # doctest: +SKIP
    0.0123
    """
    missing = [c for c in COLUMNS if c not in LATE_REQUEST_COLUMNS and c not in getattr(frame, "columns", ())]
    if missing:
        raise LoadError(f"not a load frame: missing columns {', '.join(missing)}")
    # A frame read back from CSV has NaN where the error was "".
    ok = (frame["status"].to_numpy() == 200) & (frame["error"].fillna("").to_numpy() == "")
    done = (frame["scheduled_at"] + frame["client_seconds"]).to_numpy(dtype=float)
    wall = float(np.nanmax(done)) if np.isfinite(done).any() else math.nan
    lag = frame["send_lag"].to_numpy(dtype=float)
    lag = lag[np.isfinite(lag)]
    out = {"n": len(frame), "ok": int(ok.sum()), "failed": int(len(frame) - ok.sum())}
    out.update(percentiles(frame["server_seconds"].to_numpy(dtype=float)[ok], "server"))
    out.update(percentiles(frame["client_seconds"].to_numpy(dtype=float)[ok], "client"))
    out["wall_seconds"] = wall
    out["throughput"] = out["ok"] / wall if wall > 0 else math.nan
    out["send_lag_p99"] = float(np.percentile(lag, 99)) if len(lag) else math.nan
    out["send_lag_max"] = float(lag.max()) if len(lag) else math.nan
    return out


# -- throughput with bounded latency -----------------------------------------------------

def bounded_throughput(url, body, sla_p99, rates=None, duration=5.0, low=1.0, high=4096.0, tolerance=0.1,
                       max_steps=8, seed=0, timeout=None, max_in_flight=1000):
    """The highest Poisson rate whose p99 client latency stays within ``sla_p99``.

    Each step is an :func:`open_loop` trial of ``duration`` seconds; a rate
    passes when no request failed and the p99 of ``client_seconds`` is at
    most ``sla_p99``. Without ``rates``, the rate doubles from ``low`` (up to
    ``high``) until a step fails, then bisects between the best passing and
    the lowest failing rate until they are within ``tolerance`` (relative).
    With ``rates``, they are tried in increasing order until one fails
    (``low``, ``high`` and ``tolerance`` are then unused). At most
    ``max_steps`` steps, each bounded by ``duration + timeout`` seconds.

    Parameters
    ----------
    url : str
    body : bytes
    sla_p99 : float
        Latency bound in seconds.
    rates : sequence of float, optional
    duration : float
        Seconds of arrivals per step.
    low, high : float
        Search range of the rate (requests per second).
    tolerance : float
        Stop bisecting once ``(fail - pass) / pass <= tolerance``.
    max_steps : int
    seed : int
        Arrival schedule seed, the same for every step.
    timeout : float, optional
        Per-request timeout and drain time of a step (default
        ``2 * sla_p99 + 0.5``: a request still running by then is over the SLA).
    max_in_flight : int

    Returns
    -------
    dict
        ``rate`` (0.0 if no rate passed), ``p99`` at that rate (NaN if none),
        ``sla_p99`` and ``steps``: one ``{"rate", "p99", "ok", "failed",
        "passed"}`` per trial, in order.

    Examples
    --------
    >>> bounded_throughput(srv.url + "/predict", body, sla_p99=0.5)["rate"]   # doctest: +SKIP
    37.5
    """
    sla = positive_number("sla_p99", sla_p99, LoadError)
    duration = positive_number("duration", duration, LoadError)
    low, high = positive_number("low", low, LoadError), positive_number("high", high, LoadError)
    if low > high:
        raise LoadError(f"low ({low}) must not exceed high ({high})")
    tolerance = positive_number("tolerance", tolerance, LoadError)
    max_steps = positive_int("max_steps", max_steps, LoadError)
    timeout = 2.0 * sla + 0.5 if timeout is None else positive_number("timeout", timeout, LoadError)
    if rates is not None:
        rates = sorted(positive_number("rates[]", r, LoadError) for r in rates)
        if not rates:
            raise LoadError("rates must not be empty")
    url, body = _loopback_url(url), _body_bytes(body)

    async def search():
        steps = []

        async def step(rate):
            frame = await aopen_loop(url, body, rate, duration=duration, seed=seed, timeout=timeout,
                                     max_in_flight=max_in_flight, deadline=duration + timeout)
            s = summary(frame)
            passed = s["failed"] == 0 and s["client_p99"] <= sla
            steps.append({"rate": rate, "p99": s["client_p99"], "ok": s["ok"], "failed": s["failed"],
                          "passed": bool(passed)})
            return passed

        if rates is not None:
            for rate in rates[:max_steps]:
                if not await step(rate):
                    break
            return steps
        rate, good, bad = low, None, None
        while len(steps) < max_steps:
            if await step(rate):
                good = rate
            else:
                bad = rate
            if bad is None:
                if good >= high:
                    break
                rate = min(2.0 * good, high)
            elif good is None or bad - good <= tolerance * good:
                break
            else:
                rate = (good + bad) / 2.0
        return steps

    steps = _run_sync(search)
    passing = [s for s in steps if s["passed"]]
    best = max(passing, key=lambda s: s["rate"], default=None)
    return {"rate": best["rate"] if best else 0.0, "p99": best["p99"] if best else math.nan,
            "sla_p99": sla, "steps": steps}


# -- the generator's own cost ------------------------------------------------------------

_TRIVIAL_BODY = json.dumps({"count": 1, "stages": dict.fromkeys(STAGES, 0.0), "server_seconds": 0.0,
                            "pid": os.getpid()}).encode()


@contextlib.asynccontextmanager
async def _trivial_endpoint():
    """An aiohttp server on 127.0.0.1 (free port) that answers every ``POST`` at once; yields its URL.

    It runs on the caller's event loop: a thread of its own would make the
    client and server contend for the GIL, which halves the requests/s.
    """
    async def answer(request):
        await request.read()
        return web.Response(body=_TRIVIAL_BODY, content_type="application/json")

    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/predict"
    finally:
        await runner.cleanup()


def measure_generator(rate=500, duration=3.0, requests_closed=3000, concurrency=16):
    """The load generator's own limits, against a trivial in-process endpoint.

    Starts an aiohttp endpoint on 127.0.0.1 that answers at once, runs a
    closed loop (``requests_closed`` requests, ``concurrency`` in flight) for
    the most requests per second this process can drive, then an open loop
    at ``rate`` for ``duration`` seconds for the send lag at that rate. The
    endpoint is stopped in all cases. It shares the generator's event loop,
    so both numbers include its (small) work: they are lower bounds.

    Parameters
    ----------
    rate : float
        Open-loop requests per second.
    duration : float
        Open-loop seconds.
    requests_closed : int
        Closed-loop requests (after a warm-up of up to 200).
    concurrency : int
        Closed-loop requests in flight.

    Returns
    -------
    dict
        ``closed_rps``, ``closed_seconds``, ``closed_requests``,
        ``closed_failed``, ``concurrency``, ``rate``, ``duration``,
        ``open_requests``, ``open_failed``, ``send_lag_p50``,
        ``send_lag_p99``, ``send_lag_max``, ``open_client_p99`` (seconds).

    Examples
    --------
    >>> measure_generator(rate=500, duration=1.0)["closed_rps"] > 0   # doctest: +SKIP
    True
    """
    rate = positive_number("rate", rate, LoadError)
    duration = positive_number("duration", duration, LoadError)
    requests_closed = positive_int("requests_closed", requests_closed, LoadError)
    concurrency = positive_int("concurrency", concurrency, LoadError)
    body = b'{"rows":[[0.0]]}'

    async def run():
        async with _trivial_endpoint() as url:
            # A warm-up, so first-call costs stay out of the numbers.
            await aclosed_loop(url, body, requests=min(200, requests_closed), concurrency=concurrency,
                               timeout=10.0)
            closed = await aclosed_loop(url, body, requests=requests_closed, concurrency=concurrency,
                                        timeout=10.0, deadline=60.0)
            opened = await aopen_loop(url, body, rate, duration=duration, timeout=10.0, deadline=duration + 10.0)
        return closed, opened

    closed, opened = _run_sync(run)
    c, o = summary(closed), summary(opened)
    lag = opened["send_lag"].to_numpy(dtype=float)
    lag = lag[np.isfinite(lag)]
    return {"closed_requests": c["n"], "closed_failed": c["failed"], "concurrency": concurrency,
            "closed_seconds": c["wall_seconds"], "closed_rps": c["throughput"],
            "rate": rate, "duration": duration, "open_requests": o["n"], "open_failed": o["failed"],
            "send_lag_p50": float(np.median(lag)) if len(lag) else math.nan,
            "send_lag_p99": o["send_lag_p99"], "send_lag_max": o["send_lag_max"],
            "open_client_p99": o["client_p99"]}
