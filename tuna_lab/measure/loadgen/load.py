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

:func:`measure_generator` measures the generator itself against a trivial
endpoint in another process.

Every request is the user's own: one ``body`` or several sent in turn
(request ``i`` carries ``body[i % len(body)]``), and ``send=``, a
:class:`~tuna_lab.measure.loadgen.requests.Send`, holds the rest: any
``method``, extra ``headers``, a ``content_type``, and how answers are read.
Its ``response="lab"`` (the default) reads the lab server's JSON answer
(``server_seconds``, the stages, ``pid``, CPU); ``response="any"`` measures a
user's own app and reads no body. Either way the W3C ``Server-Timing`` header
is read (:func:`.parse_server_timing`): a 2xx response's duration there (the
first metric with a ``dur``, or the one ``Send.server_timing`` names) is its
``server_seconds`` when the body gave none, and ``frame.attrs["server_timing"]``
counts what was found.

Every trial returns one row per request (:data:`COLUMNS`, the same tuple as
:data:`tuna_lab.measure.schema.REQUEST_COLUMNS`); a request is ok when its
status is 2xx; failures are rows (``status`` -1 for client-side failures,
the HTTP status and the server's error text otherwise), never exceptions.
Only loopback ``http://`` targets (127.0.0.0/8, ``localhost``, ``::1``) are
accepted, redirects are not followed, no proxy is used, and every trial is
bounded in request count and wall time.

The generator costs about what a C load generator costs: each trial runs
in a thread of its own on :func:`tuna_lab.measure.loadgen.wire.drive` (raw HTTP/1.1
on one epoll; see docs/load-bench.md for it side by side with wrk). That
thread can be pinned (``cpus=``) and exits with the trial, and its CPU time
is in every frame's ``attrs["generator"]`` (:data:`GENERATOR_KEYS`).

The functions are synchronous: they block until the trial is done. From a
thread that runs an event loop (a Jupyter cell), ``await aclosed_loop(...)``
/ ``await aopen_loop(...)`` run the same trial and let the loop run meanwhile.

Examples
--------
>>> from tuna_lab.measure.loadgen.load import payload, closed_loop, summary
>>> body = payload("small", 100)
>>> # skipped: needs a running server (srv)
>>> frame = closed_loop(srv.url + "/predict", body, requests=200)   # doctest: +SKIP
>>> summary(frame)["client_p99"]   # doctest: +SKIP
0.41

A user's own app, with two bodies in turn, a header and the app's
``Server-Timing: app;dur=...`` as ``server_seconds``:

>>> # skipped: needs a server on port 8080
>>> send = Send(headers={"X-Tenant": "lab"}, response="any", server_timing="app")
>>> frame = closed_loop("http://127.0.0.1:8080/score", [b'{"x": 1}', b'{"x": 2}'], requests=200,
...                     send=send)   # doctest: +SKIP
>>> frame.attrs["server_timing"]["parsed"]   # doctest: +SKIP
200
>>> parse_server_timing('db;dur=2.5, app;dur=12.5;desc="model"', "app")
0.0125
"""

import asyncio
import concurrent.futures
import math
import os
import resource
import threading
import time

import numpy as np

from ..._checks import format_cpulist, non_negative_int, parse_cpulist, positive_int, positive_number
from ...errors import LoadError
from ..records import Records
from .schedule import payload, poisson_schedule
from ..schema import LATE_REQUEST_COLUMNS, percentiles
from .server_timing import METRIC_NAME, parse_server_timing
from .trivial import trivial_endpoint
from .requests import Send, describe_sent
from .wire import check_url, drive, request_bytes, resolve, sent_header
# The columns of a trial's frame (one row per request, documented in
# tuna_lab.measure.schema), under the name this module has always given them.
from ..schema import REQUEST_COLUMNS as COLUMNS

__all__ = [
    "COLUMNS",
    "GENERATOR_KEYS",
    "Send",
    "payload",
    "parse_server_timing",
    "poisson_schedule",
    "closed_loop",
    "aclosed_loop",
    "open_loop",
    "aopen_loop",
    "summary",
    "measure_generator",
    "ensure_fds",
]

#: The keys of ``frame.attrs["generator"]``, the load generator's own cost in a
#: trial: CPU seconds (user, system, their sum) of the generating thread(s)
#: only, the sorted CPU ids it ran on, how many processes generated load, how
#: many requests were sent and the trial's wall-clock seconds.
GENERATOR_KEYS = ("cpu_user", "cpu_sys", "cpu_seconds", "cpus", "processes", "requests", "wall_seconds", "engine",
                  "engine_why")

# File descriptors left for everything but the trial's sockets.
_FD_RESERVE = 64
# What response= may say: the lab server's JSON body, or a body not read at all.
_RESPONSES = ("lab", "any")


# -- input checks ------------------------------------------------------------------------

def _body_bytes(body):
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise LoadError(f"body must be bytes (see payload()) or a non-empty list of bytes, got {type(body).__name__}")


def _bodies(body):
    """``body`` (bytes, or a non-empty list or tuple of them sent in turn) as a tuple of bytes."""
    if isinstance(body, (list, tuple)):
        if not body:
            raise LoadError("body must not be an empty list: give at least one body")
        return tuple(_body_bytes(b) for b in body)
    return (_body_bytes(body),)


def _requests(url, body, send):
    """Check what a trial sends and how it reads the answers: ``(url, request, attrs)``.

    ``send`` is a :class:`~tuna_lab.measure.loadgen.requests.Send`, or None for its defaults.

    ``request`` is the bytes of the one request, or a tuple of them (one per
    body, in turn) for :func:`~tuna_lab.measure.loadgen.wire.drive`; ``attrs`` the
    frame's ``method``, ``bodies`` (distinct), ``response``, the
    Server-Timing ``metric`` and ``sent``, what request ``i`` sends
    (``sent[i % len(sent)]``, :func:`~tuna_lab.measure.loadgen.requests.describe_sent`).
    """
    url, bodies = check_url(url), _bodies(body)
    if send is None:
        send = Send()
    elif not isinstance(send, Send):
        raise LoadError(f"send must be a Send (tuna_lab.measure.loadgen.requests), got {type(send).__name__}")
    method, headers, content_type = send.method, send.headers, send.content_type
    response, server_timing = send.response, send.server_timing
    if not isinstance(response, str) or response not in _RESPONSES:
        raise LoadError(f"response must be 'lab' (the lab server's JSON) or 'any' (no body read), got {response!r}")
    if server_timing is not None and (not isinstance(server_timing, str) or not METRIC_NAME.fullmatch(server_timing)):
        raise LoadError(f"server_timing must be a Server-Timing metric name (a token), got {server_timing!r}")
    built = {}
    for b in bodies:
        if b not in built:
            built[b] = request_bytes(url, b, content_type, method, headers)
    request = built[bodies[0]] if len(bodies) == 1 else tuple(built[b] for b in bodies)
    sent = tuple(describe_sent(method, sent_header(built[b], "Content-Type"), b) for b in bodies)
    # The answer to a HEAD has no body: not even the lab server's JSON to read.
    read = "any" if method == "HEAD" else response
    return url, request, {"method": method, "bodies": len(built), "response": response, "metric": server_timing,
                          "read": read, "sent": sent}


def _check_fds(connections):
    ensure_fds(connections)


def ensure_fds(connections, error=LoadError):
    """Make room for ``connections`` sockets: raise the soft file-descriptor limit if the hard one allows.

    Each request in flight holds a socket, plus a reserve for everything
    else. A soft limit below that is raised up to what is needed (never past
    the hard limit, which only root may raise); when even the hard limit is
    too low, ``error`` says so in one line, before any server starts.

    Returns
    -------
    int
        The soft limit now in force.

    Examples
    --------
    >>> ensure_fds(10) >= 10
    True
    >>> ensure_fds(10 ** 12)
    Traceback (most recent call last):
    ...
    tuna_lab.errors.LoadError: 1000000000000 connections need 1000000000064 file descriptors ...
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = int(connections) + _FD_RESERVE
    if soft == resource.RLIM_INFINITY or need <= soft:
        return soft
    if hard == resource.RLIM_INFINITY or need <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return need
    raise error(f"{connections} connections need {need} file descriptors but the hard limit is {hard}; "
                "lower the concurrency, or have the hard limit raised (`ulimit -Hn`, limits.conf, systemd's "
                "LimitNOFILE)")


# -- the generator's thread ---------------------------------------------------------

def _cpu_set(cpus):
    """``cpus`` (an iterable of CPU ids or a cpulist string) as a sorted tuple, or None; checked."""
    if cpus is None:
        return None
    if isinstance(cpus, str):
        ids = parse_cpulist(cpus, "cpus", LoadError)
    else:
        try:
            ids = tuple(non_negative_int("cpus[]", c, LoadError) for c in cpus)
        except TypeError:
            raise LoadError(f"cpus must be an iterable of CPU ids, got {cpus!r}") from None
    if not ids:
        raise LoadError("cpus must name at least one CPU")
    allowed = os.sched_getaffinity(0) | os.sched_getaffinity(os.getpid())
    bad = sorted(set(ids) - allowed)
    if bad:
        raise LoadError(f"cpus {format_cpulist(bad)} are not allowed for this process "
                        f"(allowed: {format_cpulist(allowed)})")
    return tuple(sorted(set(ids)))


def _generate(job, cpus):
    """Run ``job()`` in this (fresh) generator thread, pinned to ``cpus``; return its result and cost.

    Runs in a thread of its own that exits when the trial is done, so the
    pinning never outlives the trial, and ``RUSAGE_THREAD`` counts the
    generator's CPU alone (not a caller's other threads, e.g. a sampler).
    """
    if cpus is not None:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as exc:
            raise LoadError(f"cannot pin the load generator to CPUs {format_cpulist(cpus)}: "
                            f"{exc.strerror or exc}") from None
    ran_on = sorted(os.sched_getaffinity(0))
    wall0, use0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_THREAD)
    rec, attrs = job()
    use1, wall1 = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
    user, sys_ = use1.ru_utime - use0.ru_utime, use1.ru_stime - use0.ru_stime
    attrs["generator"] = {"cpu_user": user, "cpu_sys": sys_, "cpu_seconds": user + sys_, "cpus": ran_on,
                          "processes": 1, "requests": int(np.count_nonzero(np.isfinite(rec.sent))),
                          "wall_seconds": wall1 - wall0,
                          # which loop sent it: "c", or "python" and why (wire.drive's choice, never silent)
                          **getattr(rec, "engine", {"engine": "python", "engine_why": "not recorded"})}
    return rec, attrs


def _start_generator(job, cpus):
    """Start ``job`` in a new generator thread (see :func:`_generate`); a future of ``(rec, attrs)``."""
    future = concurrent.futures.Future()

    def main():
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(_generate(job, cpus))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            future.set_exception(exc)

    threading.Thread(target=main, name="tuna-load", daemon=True).start()
    return future


def _run_blocking(job, cpus):
    """Run a trial in a generator thread and wait for it; its frame (parsed in the caller's thread)."""
    return _frame(*_start_generator(job, cpus).result())


async def _run_async(job, cpus):
    """:func:`_run_blocking` for a caller in an event loop: the loop keeps running while it waits."""
    return _frame(*await asyncio.wrap_future(_start_generator(job, cpus)))


def _frame(rec, attrs):
    """The trial's frame; a 4xx answer's ``error`` says what its request sent (the server refused *that*)."""
    sent = attrs.pop("sent", ())
    frame = rec.frame(attrs)
    status = frame["status"].to_numpy()
    refused = np.flatnonzero((status >= 400) & (status < 500))
    if len(refused) and sent:
        errors = frame["error"].to_numpy(dtype=object).copy()
        for i in refused:
            errors[i] = f"HTTP {status[i]} to {sent[i % len(sent)]}: {errors[i]}"
        frame["error"] = errors
    return frame


# -- closed loop -------------------------------------------------------------------------

def _closed_plan(url, body, requests, concurrency, timeout, deadline, send, reuse=None):
    """Check a closed loop's arguments; the job that runs it in the generator thread."""
    url, request, what = _requests(url, body, send)
    n = positive_int("requests", requests, LoadError)
    workers = n if concurrency is None else min(n, positive_int("concurrency", concurrency, LoadError))
    timeout = positive_number("timeout", timeout, LoadError)
    deadline = 2.0 * timeout if deadline is None else positive_number("deadline", deadline, LoadError)
    reuse = None if reuse is None else positive_int("reuse", reuse, LoadError)
    _check_fds(workers)
    address = resolve(url)

    def job():
        rec = Records(n, response=what["read"], metric=what["metric"])
        rec.cut(drive(rec, address, request, workers, timeout, deadline, reuse=reuse))
        return rec, {"mode": "closed", "url": url, "method": what["method"], "bodies": what["bodies"],
                     "sent": what["sent"],
                     "response": what["response"], "requests": n, "concurrency": workers,
                     "timeout": timeout, "deadline": deadline, "reuse": reuse}

    return job


async def aclosed_loop(url, body, requests=1000, concurrency=None, timeout=120.0, deadline=None, cpus=None, *,
                       send=None, reuse=None):
    """Async variant of :func:`closed_loop`, for callers already in an event loop.

    Examples
    --------
    >>> # skipped: needs a running server and an event loop
    >>> frame = await aclosed_loop(url, body, requests=100)   # doctest: +SKIP
    """
    job = _closed_plan(url, body, requests, concurrency, timeout, deadline, send, reuse)
    return await _run_async(job, _cpu_set(cpus))


def closed_loop(url, body, requests=1000, concurrency=None, timeout=120.0, deadline=None, cpus=None, *,
                send=None, reuse=None):
    """Send ``requests`` requests with ``concurrency`` in flight; one row per request.

    Parameters
    ----------
    url, body : str, bytes or list of bytes
        A loopback URL; the request body, or several bodies sent in turn.
    requests, concurrency : int
        Requests to send; requests in flight (default ``requests``: all at once).
    timeout, deadline : float
        Seconds a request may take; seconds the whole trial may take (default ``2 * timeout``).
    cpus : iterable of int or str, optional
        The generator's CPUs (ids or a cpulist); default: wherever this process may run.
    send : Send, optional
        What is sent beside the body (method, headers, ``Content-Type``) and how answers are read
        (``response``, ``server_timing``): :class:`~tuna_lab.measure.loadgen.requests.Send`; default ``Send()``,
        a ``POST`` of JSON to the lab server.
    reuse : int, optional
        Requests one keep-alive connection carries at most, then a new one is opened (default: no limit):
        reconnecting lets the kernel hand connections to every worker of a server (see ``drive``).

    Returns
    -------
    pandas.DataFrame
        Columns :data:`COLUMNS`; ``attrs`` holds the arguments, ``"generator"`` and ``"server_timing"``.

    Raises
    ------
    LoadError
        A URL that is not loopback, a bad argument, or CPUs this process may not use.

    Notes
    -----
    See docs/experiment.md, section "What the loops return" (the rows, their errors and ``attrs``).

    Examples
    --------
    >>> # skipped: needs a running server (srv)
    >>> frame = closed_loop(srv.url + "/predict", payload("small", 100), requests=1000)   # doctest: +SKIP
    >>> frame = closed_loop(url, b"", requests=100, send=Send(method="GET", response="any"))   # doctest: +SKIP
    """
    job = _closed_plan(url, body, requests, concurrency, timeout, deadline, send, reuse)
    return _run_blocking(job, _cpu_set(cpus))


# -- open loop ---------------------------------------------------------------------------

def _open_plan(url, body, rate, requests, duration, seed, timeout, max_in_flight, deadline, send, reuse=None):
    """Check an open loop's arguments; the job that runs it in the generator thread."""
    url, request, what = _requests(url, body, send)
    at = poisson_schedule(rate, requests, duration, seed)
    timeout = positive_number("timeout", timeout, LoadError)
    slots = positive_int("max_in_flight", max_in_flight, LoadError)
    span = float(at[-1])
    deadline = span + timeout if deadline is None else positive_number("deadline", deadline, LoadError)
    reuse = None if reuse is None else positive_int("reuse", reuse, LoadError)
    _check_fds(min(slots, len(at)))
    address = resolve(url)

    def job():
        rec = Records(len(at), scheduled=at, response=what["read"], metric=what["metric"])
        # At most `slots` requests (and sockets) in flight. A request waiting for
        # a slot is sent late, and its send_lag and client_seconds (from the
        # schedule) include the wait.
        rec.cut(drive(rec, address, request, min(slots, len(at)), timeout, deadline, schedule=at, reuse=reuse))
        return rec, {"mode": "open", "url": url, "method": what["method"], "bodies": what["bodies"],
                     "sent": what["sent"],
                     "response": what["response"], "rate": float(rate), "seed": seed, "requests": len(at),
                     "duration": duration, "timeout": timeout, "max_in_flight": slots, "deadline": deadline,
                     "reuse": reuse}

    return job


async def aopen_loop(url, body, rate, requests=None, duration=None, seed=0, timeout=30.0,
                     max_in_flight=1000, deadline=None, cpus=None, *, send=None, reuse=None):
    """Async variant of :func:`open_loop`, for callers already in an event loop.

    Examples
    --------
    >>> # skipped: needs a running server and an event loop
    >>> frame = await aopen_loop(url, body, rate=50, duration=2.0)   # doctest: +SKIP
    """
    job = _open_plan(url, body, rate, requests, duration, seed, timeout, max_in_flight, deadline, send, reuse)
    return await _run_async(job, _cpu_set(cpus))


def open_loop(url, body, rate, requests=None, duration=None, seed=0, timeout=30.0, max_in_flight=1000,
              deadline=None, cpus=None, *, send=None, reuse=None):
    """Send requests at ``rate`` per second with Poisson arrivals; latency from each *scheduled* time.

    Parameters
    ----------
    rate : float
        Mean requests per second.
    requests, duration : int, float, optional
        At most ``requests`` requests, scheduled before ``duration`` seconds; give at least one.
    seed : int
        Seed of the arrival schedule (:func:`.poisson_schedule`).
    timeout, deadline : float
        Seconds a request may take once sent; of the trial (default: last arrival + ``timeout``).
    max_in_flight : int
        Most requests in flight; later arrivals wait for a slot, which shows as ``send_lag``.
    url, body, cpus, send, reuse
        As for :func:`closed_loop`.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`COLUMNS` and ``attrs``, as for :func:`closed_loop`.

    Notes
    -----
    See docs/experiment.md, section "What the loops return" (``client_seconds`` and ``send_lag``).

    Examples
    --------
    >>> # skipped: needs a running server (srv)
    >>> frame = open_loop(srv.url + "/predict", body, rate=50, duration=5.0)   # doctest: +SKIP
    """
    job = _open_plan(url, body, rate, requests, duration, seed, timeout, max_in_flight, deadline, send, reuse)
    return _run_blocking(job, _cpu_set(cpus))


# -- analysis ----------------------------------------------------------------------------

def summary(frame):
    """Counts, latency percentiles, throughput and send lag of one trial.

    Percentiles (:func:`tuna_lab.measure.schema.percentiles`: linear, as
    :func:`numpy.percentile`) and means are over the ok rows (status 2xx, no
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
    >>> # skipped: needs a load trial's frame
    >>> summary(frame)["client_p99"]   # doctest: +SKIP
    0.0123
    """
    missing = [c for c in COLUMNS if c not in LATE_REQUEST_COLUMNS and c not in getattr(frame, "columns", ())]
    if missing:
        raise LoadError(f"not a load frame: missing columns {', '.join(missing)}")
    # A frame read back from CSV has NaN where the error was "".
    status = frame["status"].to_numpy()
    ok = (status >= 200) & (status < 300) & (frame["error"].fillna("").to_numpy() == "")
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


# -- the generator's own limits ----------------------------------------------------------

def measure_generator(rate=500, duration=3.0, requests_closed=3000, concurrency=16, cpus=None):
    """The load generator's own limits, against a trivial endpoint in another process.

    Starts :func:`tuna_lab.measure.loadgen.trivial.trivial_endpoint` (127.0.0.1, answers
    at once, keep-alive), runs a closed loop (``requests_closed`` requests,
    ``concurrency`` in flight) for the most requests per second the generator
    can drive and its CPU per request, then an open loop at ``rate`` for
    ``duration`` seconds for the send lag at that rate. The endpoint is
    stopped in all cases. It runs in a process of its own, and on a machine
    with few CPUs it competes with the generator for them: the numbers are
    lower bounds of what the generator can do.

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
    cpus : iterable of int or str, optional
        The generator's CPUs (see :func:`closed_loop`).

    Returns
    -------
    dict
        ``closed_rps``, ``closed_seconds``, ``closed_requests``,
        ``closed_failed``, ``closed_cpu_per_request``, ``concurrency``,
        ``rate``, ``duration``, ``open_requests``, ``open_failed``,
        ``open_cpu_per_request``, ``send_lag_p50``, ``send_lag_p99``,
        ``send_lag_max``, ``open_client_p99`` (seconds).

    Examples
    --------
    >>> # skipped: starts a server and measures for seconds
    >>> measure_generator(rate=500, duration=1.0)["closed_rps"] > 0   # doctest: +SKIP
    True
    """
    rate = positive_number("rate", rate, LoadError)
    duration = positive_number("duration", duration, LoadError)
    requests_closed = positive_int("requests_closed", requests_closed, LoadError)
    concurrency = positive_int("concurrency", concurrency, LoadError)
    cpus = _cpu_set(cpus)
    body = b'{"rows":[[0.0]]}'

    with trivial_endpoint() as url:
        # A warm-up, so first-call costs stay out of the numbers.
        closed_loop(url, body, requests=min(200, requests_closed), concurrency=concurrency, timeout=10.0,
                    cpus=cpus)
        closed = closed_loop(url, body, requests=requests_closed, concurrency=concurrency, timeout=10.0,
                             deadline=60.0, cpus=cpus)
        opened = open_loop(url, body, rate, duration=duration, timeout=10.0, deadline=duration + 10.0, cpus=cpus)
    c, o = summary(closed), summary(opened)
    lag = opened["send_lag"].to_numpy(dtype=float)
    lag = lag[np.isfinite(lag)]

    def per_request(frame):
        cost = frame.attrs["generator"]
        return cost["cpu_seconds"] / cost["requests"] if cost["requests"] else math.nan

    return {"closed_requests": c["n"], "closed_failed": c["failed"], "concurrency": concurrency,
            "closed_seconds": c["wall_seconds"], "closed_rps": c["throughput"],
            "closed_cpu_per_request": per_request(closed),
            "rate": rate, "duration": duration, "open_requests": o["n"], "open_failed": o["failed"],
            "open_cpu_per_request": per_request(opened),
            "send_lag_p50": float(np.median(lag)) if len(lag) else math.nan,
            "send_lag_p99": o["send_lag_p99"], "send_lag_max": o["send_lag_max"],
            "open_client_p99": o["client_p99"]}
