"""What a running server's threads do under a few requests: :func:`serve_requests`.

The CPU time each worker thread gains while the server serves a few
requests (:class:`Activity`) tells pool threads that wait in libc from
helper threads, and the master's and front ends' share of the work
(:func:`front_work`). The requests are sent by the one load generator
(:func:`tuna_lab.measure.loadgen.rounds.round_sender`), handed in by the
caller: ``live/`` lies below ``measure/`` in the layers (measure's targets
use live's pin), so it takes the sender and does not import it.
"""

import contextlib
import time
from dataclasses import dataclass

import psutil

from ..errors import PinError
from .pools import thread_cpu_times
from .roles import server_roles

__all__ = ["Activity", "activity_of", "serve_requests", "front_work", "role_cpu_times", "FAIR_SHARE",
           "FRONT_SHARE", "FRONT_FLOOR"]

@dataclass
class Activity:
    """CPU time every worker thread gained while a server served requests.

    ``threads[pid][tid]`` is seconds gained by thread ``tid`` of worker
    ``pid``; ``requests`` how many requests were sent over ``seconds`` wall
    seconds; ``idle`` the workers that gained (next to) no CPU time, i.e.
    served none of them.
    """

    threads: dict
    requests: int = 0
    seconds: float = 0.0
    idle: tuple = ()
    front: dict = None


# What a worker must gain in CPU time (s) over the requests to count as having served some.
_SERVED = 0.005
#: ... and each worker at least this share of the busiest one's CPU: the kernel may hand one worker most of
# a few requests, and a worker that served one of them may not have woken its pool (ONNX Runtime's runs a
# small request on the main thread alone), which would then not be told by its activity.
FAIR_SHARE = 0.25
#: The master and front ends do real work (:func:`front_work`) when they use at least this share of the
#: workers' CPU time ...
FRONT_SHARE = 0.05
#: ... and at least this many seconds: a Gunicorn or uvicorn master that only watches its workers uses none.
FRONT_FLOOR = 0.01


def role_cpu_times(roles):
    """``{pid: CPU seconds so far}`` of every process of ``roles`` (a :class:`ServerRoles`); gone ones left out.

    A process's own count (``utime + stime``, clock ticks), not the sum of
    its threads': a threaded HTTP server's request threads have ended by the
    time it is read, and their time with them.
    """
    out = {}
    for proc in (roles.master, *roles.helpers, *roles.workers):
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(proc.pid).cpu_times()
            out[proc.pid] = times.user + times.system
    return out


def front_work(roles, before, after, requests=None):
    """What the master, helpers and front ends ran beside the workers between two :func:`role_cpu_times`.

    A master that parses HTTP and JSON (MLServer's) or an API front end
    (LitServe's) runs the same requests as the workers; none of it is placed
    by a plan. Returns ``{"processes": [{"pid", "role", "cpu_s"}], "front_cpu_s",
    "workers_cpu_s", "requests", "real_work", "text"}``: ``real_work`` when
    the front used at least :data:`FRONT_SHARE` of the workers' CPU time and
    :data:`FRONT_FLOOR` seconds; ``text`` says it in one line ("master used
    0.22 s of CPU against 1.09 s for the workers over 50 requests").
    """
    def gained(pid):
        return max(0.0, after.get(pid, 0.0) - before.get(pid, 0.0)) if pid in before else 0.0

    fronts = [{"pid": p.pid, "role": p.role, "cpu_s": round(gained(p.pid), 4)} for p in (roles.master, *roles.helpers)]
    workers = sum(gained(w.pid) for w in roles.workers)
    front = sum(f["cpu_s"] for f in fronts)
    busy = [f for f in fronts if f["cpu_s"] >= FRONT_FLOOR / 2] or fronts[:1]
    words = ", ".join(f"{f['role']} {f['pid']} used {f['cpu_s']:.2f} s" for f in busy)
    over = f" over {requests} requests" if requests else ""
    text = f"{words} of CPU against {workers:.2f} s for the workers{over}"
    return {"processes": fronts, "front_cpu_s": round(front, 4), "workers_cpu_s": round(workers, 4),
            "requests": requests, "real_work": front >= FRONT_FLOOR and front >= FRONT_SHARE * workers,
            "text": text}


def serve_requests(master, send, requests=8, max_requests=64, max_seconds=15.0, choice=None):
    """Have the running server ``master`` serve a few requests and measure what each worker thread ran meanwhile.

    Parameters
    ----------
    master : int
        The server's master PID.
    send : callable
        ``send(n)`` sends ``n`` requests at once and returns when each is
        answered, raising on one that fails: the load generator's
        (:func:`tuna_lab.measure.loadgen.rounds.round_sender`).
    requests, max_requests, max_seconds : int, int, float
        Requests sent at least, at most; seconds at most.
    choice : WorkerChoice, optional
        The workers, when the user names them (:func:`server_roles`).

    Returns
    -------
    Activity
        Per worker, per thread, the CPU seconds gained; pass it to :func:`pin_server`.

    Raises
    ------
    PinError
        No such server. What ``send`` raises, before anything is bound.

    Notes
    -----
    See docs/your-server.md, section "2. One command for a server that is already running".

    Examples
    --------
    >>> # skipped: needs a running server (its master's PID and a URL of a request that runs the model)
    >>> from tuna_lab.measure.loadgen.requests import Requests
    >>> from tuna_lab.measure.loadgen.rounds import round_sender
    >>> serve_requests(master, round_sender(Requests(path=url, method="GET")))  # doctest: +SKIP
    """
    roles = server_roles(master, choice)
    workers = roles.worker_pids
    start, sent = time.monotonic(), 0
    gains = {}
    # One round first, not measured: a server's first requests make its runtime teams (libgomp makes one
    # per calling thread on first use) and start its calling threads, and a team born during the
    # measurement would be told by its birth, not by what it does under requests.
    send(len(workers))
    before = {pid: thread_cpu_times(pid) for pid in workers}
    processes = role_cpu_times(roles)
    while True:
        send(len(workers))
        sent += len(workers)
        gains = {}
        for pid in workers:
            try:
                now = thread_cpu_times(pid)
            except PinError:
                continue                           # the worker exited meanwhile
            gains[pid] = {tid: now[tid] - before[pid].get(tid, 0.0) for tid in now}
        spent = {pid: sum(gains.get(pid, {}).values()) for pid in workers}
        idle = tuple(pid for pid in workers if spent[pid] < _SERVED)
        fair = min(spent.values(), default=0.0) >= FAIR_SHARE * max(spent.values(), default=0.0)
        elapsed = time.monotonic() - start
        if (sent >= requests and not idle and fair) or sent >= max_requests or elapsed >= max_seconds:
            front = front_work(roles, processes, role_cpu_times(roles), sent)
            return Activity(gains, sent, elapsed, idle, front)


def activity_of(activity, pid):
    """``({tid: s} or None, requests)`` of worker ``pid`` from an :class:`Activity` or a plain dict."""
    if activity is None:
        return None, None
    if isinstance(activity, Activity):
        return activity.threads.get(pid), activity.requests
    return activity.get(pid), None
