"""Per-request scheduler evidence in ``Server-Timing``: the lab server's and any hooked WSGI app's (issue 50).

A worker reads, at the start and end of each request, the scheduler counters
of the threads that serve it - the calling thread and every other thread of
the worker (its OpenMP team) - with
:class:`~tuna_lab.machine.sched.KeptCounters`, and sends the deltas as the
``tuna-*`` metrics of :data:`SCHED_METRICS`. The load generator stores them
per request in ``requests.parquet`` (:mod:`tuna_lab.measure.records`).

The lab server (:mod:`tuna_lab.server.app`) times its ``/predict`` with
:func:`sched_delta` and :func:`sched_timing`; a user's app under the Gunicorn
hooks gets the same from :class:`SchedTiming`, which
:func:`tuna_lab.integrations.gunicorn.post_worker_init` wraps around the
worker's app. This module imports nothing heavier than the standard library:
a Gunicorn master loads it before it forks.

Examples
--------
>>> def app(environ, start_response):
...     start_response("200 OK", [("Content-Length", "2")])
...     return [b"ok"]
>>> seen = {}
>>> body = SchedTiming(app)({}, lambda status, headers, exc_info=None: seen.update(headers))
>>> seen["Server-Timing"].startswith("app;dur=") and "tuna-rq;dur=" in seen["Server-Timing"]
True
"""

import os
import threading
import time

from ..machine import procfs
from ..machine.sched import KeptCounters

__all__ = ["SCHED_METRICS", "sched_delta", "sched_timing", "SchedTiming"]

#: The scheduler's evidence of one request in its ``Server-Timing`` header: metric -> (parameter, meaning).
#: ``dur`` metrics are milliseconds, ``desc`` ones whole counts; the serving threads are the calling thread
#: and every other thread of the worker (its OpenMP team), read at the request's start and end
#: (:func:`sched_delta`). ``app`` is the request's ``server_seconds``.
SCHED_METRICS = {
    "app": ("dur", "the worker's time for the request"),
    "cpu": ("dur", "on-CPU time of the serving threads (their CPU clocks)"),
    "tuna-rq": ("dur", "run-queue wait of the serving threads: runnable, waiting for a CPU (schedstat)"),
    "tuna-rq-main": ("dur", "run-queue wait of the calling thread alone"),
    "tuna-nvcsw": ("desc", "voluntary switches of the serving threads (they slept or blocked)"),
    "tuna-nivcsw": ("desc", "involuntary switches of the serving threads (preemptions)"),
    "tuna-mig": ("desc", "migrations of the serving threads (absent where the kernel hides se.nr_migrations)"),
    "tuna-cpu-last": ("desc", "the CPU the calling thread ran on last"),
}


def sched_delta(before, after, caller):
    """What the serving threads did between two :meth:`~tuna_lab.machine.sched.KeptCounters.read` readings.

    A thread in ``after`` but not ``before`` was born in between and counts
    from zero; one gone by ``after`` is left out.

    Returns
    -------
    dict
        ``wait`` (run-queue wait of every thread, s), ``wait_main`` (of
        ``caller`` alone, s), ``voluntary``, ``involuntary`` (switches),
        ``migrations`` (None where the kernel hides them), ``last_cpu``
        (``caller``'s, None if it was not read) and ``run`` (on-CPU time of
        every thread from schedstat, s).

    Examples
    --------
    >>> before = {1: (0, 1000, 5, 1, 0, 0), 2: (0, 0, 9, 0, 3, 1)}
    >>> after = {1: (9, 3000, 6, 2, 1, 1), 2: (9, 500000, 9, 4, 3, 1), 3: (1, 0, 1, 0, 0, 0)}
    >>> d = sched_delta(before, after, caller=1)
    >>> d["wait"], d["wait_main"], d["voluntary"], d["involuntary"], d["migrations"], d["last_cpu"], d["run"]
    (0.000502, 2e-06, 2, 5, 1, 1, 1.9e-08)
    """
    zero = (0, 0, 0, 0, 0, 0)
    run = wait = vol = invol = mig = 0
    known = True
    for tid, now in after.items():
        was = before.get(tid, zero)
        run += now[0] - was[0]
        wait += now[1] - was[1]
        vol += now[2] - was[2]
        invol += now[3] - was[3]
        if now[4] < 0:
            known = False        # this kernel does not count migrations
        else:
            mig += now[4] - was[4]
    main = after.get(caller)
    wait_main = None if main is None else (main[1] - before.get(caller, zero)[1]) / 1e9
    return {"wait": wait / 1e9, "wait_main": wait_main, "voluntary": vol, "involuntary": invol,
            "migrations": mig if known and after else None, "last_cpu": None if main is None else main[5],
            "run": run / 1e9}


def sched_timing(server_seconds, cpu_seconds, delta):
    """The ``Server-Timing`` value of one request's :data:`SCHED_METRICS`.

    Examples
    --------
    >>> print(sched_timing(0.012, 0.02, {"wait": 0.001, "wait_main": 0.0, "voluntary": 3, "involuntary": 1,
    ...                                  "migrations": None, "last_cpu": 1}))   # doctest: +NORMALIZE_WHITESPACE
    app;dur=12.000, cpu;dur=20.000, tuna-rq;dur=1.000, tuna-rq-main;dur=0.000, tuna-nvcsw;desc=3,
    tuna-nivcsw;desc=1, tuna-cpu-last;desc=1
    """
    parts = [f"app;dur={server_seconds * 1e3:.3f}", f"cpu;dur={cpu_seconds * 1e3:.3f}",
             f"tuna-rq;dur={delta['wait'] * 1e3:.3f}"]
    if delta["wait_main"] is not None:
        parts.append(f"tuna-rq-main;dur={delta['wait_main'] * 1e3:.3f}")
    parts += [f"tuna-nvcsw;desc={delta['voluntary']}", f"tuna-nivcsw;desc={delta['involuntary']}"]
    if delta["migrations"] is not None:
        parts.append(f"tuna-mig;desc={delta['migrations']}")
    if delta["last_cpu"] is not None:
        parts.append(f"tuna-cpu-last;desc={delta['last_cpu']}")
    return ", ".join(parts)


class SchedTiming:
    """WSGI middleware: every response of ``app`` carries the :data:`SCHED_METRICS` of its request.

    The counters are read when the request enters and when the app starts its
    response (``start_response``): a WSGI app sends its headers before its
    body, so work it does while it yields a *streamed* body is not counted.
    ``app`` is the time in between (the load generator's ``server_seconds``
    when the app sends no ``Server-Timing`` of its own), ``cpu`` the serving
    threads' on-CPU time: the calling thread's own CPU clock (exact: schedstat
    moves only at ticks and switches for a thread that is running) and the
    others' schedstat. An app's own ``Server-Timing`` is
    kept, first (the metric the load generator reads by default stays the
    app's); a response that carries ``tuna-rq`` already (the lab server's) is
    left as it is. A failure to read the counters never fails the request:
    the response then goes without them.

    Parameters
    ----------
    app : callable
        The WSGI application.
    """

    def __init__(self, app):
        self.app = app
        # Descriptors of the threads' scheduler files, opened in each worker on its first request.
        self._counters = KeptCounters()

    def __getattr__(self, name):
        # The wrapped app's own attributes (a Flask app's config, say) stay reachable through the worker.
        try:
            app = self.__dict__["app"]
        except KeyError:
            raise AttributeError(name) from None
        return getattr(app, name)

    def _read(self):
        try:
            return self._counters.read(procfs.thread_ids(os.getpid()))
        except (OSError, ValueError):
            return None

    def __call__(self, environ, start_response):
        before = self._read()
        # After the first read: the reads are not the request's work (as the lab server keeps them out).
        t0, cpu0 = time.perf_counter(), time.thread_time()
        me = threading.get_native_id()

        def start(status, headers, exc_info=None):
            seconds, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
            after = self._read() if before is not None else None
            if after is not None:
                try:
                    headers = _with_timing(headers, before, after, me, seconds, cpu)
                except (ValueError, TypeError, IndexError):
                    pass                                 # headers the app built oddly: sent as they are
            return start_response(status, headers, exc_info)

        return self.app(environ, start)


def _with_timing(headers, before, after, caller, seconds, caller_cpu):
    """``headers`` (a list of pairs) with the request's metrics added to its ``Server-Timing``; ``caller_cpu``
    is the calling thread's CPU time by its own clock."""
    headers = list(headers)
    at = next((i for i, (name, _) in enumerate(headers) if name.lower() == "server-timing"), None)
    theirs = None if at is None else headers[at][1]
    if theirs is not None and "tuna-rq" in theirs:
        return headers                                   # timed already (the lab server's own app)
    delta = sched_delta(before, after, caller)
    zero = (0,)
    others = delta["run"] - (after.get(caller, zero)[0] - before.get(caller, zero)[0]) / 1e9
    ours = sched_timing(seconds, caller_cpu + max(0.0, others), delta)
    if at is None:
        headers.append(("Server-Timing", ours))
    else:
        headers[at] = (headers[at][0], f"{theirs}, {ours}")
    return headers
