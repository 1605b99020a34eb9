"""The trial runner: one (trial, policy) of a cell against a target, measured and turned into rows.

:func:`run_trials` runs every (trial, policy) of a :class:`TrialPlan` in its
order and yields a :class:`Measured` as each finishes. One trial:

1. the target applies the policy (:meth:`~tuna_lab.measure.target.Target.apply`:
   the lab server or a user's app started under it, a running server pinned live);
2. the server settles (:func:`drain`: no request queued at its port, its
   processes' main threads idle - a worker still loading its app is not),
   then warm-up requests go until every worker answered some (by the PID
   its answers carry, else by its CPU time growing), during which every
   worker thread's CPU time is read, so that the pool threads are known by
   what they did; a worker that answers none fails the trial;
3. the placement is applied and read back from ``/proc``
   (:meth:`~tuna_lab.measure.target.Live.place`); a placement not in effect
   fails the trial before any measured request. A worker whose pool was not
   found (fewer than T-1 pool threads) is warmed and placed once more;
4. the load (closed loop: ``requests`` with ``concurrency`` in flight; open
   loop: Poisson arrivals at ``rate`` for ``duration``), with every server
   thread's CPU time sampled;
5. the trial's row: counts, the latency percentiles (server-side where the
   server says it - the lab server's own timings or a ``Server-Timing``
   header - else client-side, and the ``latency`` column says which), CPU
   and the generator's cost, and the scheduler's evidence
   (:data:`~tuna_lab.measure.schema.EVIDENCE_COLUMNS`: run-queue wait,
   migrations, switches, other processes' CPU and interrupts on the serving
   CPUs, the master's and front ends' CPU), read before and after the load.
   A trial with more failed requests (non-2xx,
   timeouts) than ``max_error_rate`` is marked failed, never averaged in;
   so is a trial during which a worker was replaced or the master died
   (:data:`~tuna_lab.measure.schema.FAULT_COLUMNS`, compared between the
   start of the warm-up and the end of the load).

Examples
--------
>>> from tuna_lab.measure.trials import latency_of
>>> import pandas as pd
>>> latency_of(pd.DataFrame({"server_seconds": [float("nan")], "client_seconds": [0.2]}), "any")
'client'
"""

import time
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import psutil

from .._checks import format_cpulist, one_line
from ..errors import CpuAccountingError, TunaError
from ..machine import procfs
from .cpu import CpuSampler, SchedEvidence, account, summarize_threads, thread_role, worker_balance
from .schema import (BALANCE_COLUMNS, CPU_COLUMNS, EVIDENCE_COLUMNS, FAULT_COLUMNS, GENERATOR_COLUMNS, PHASE_COLUMNS,
                     fair_share, percentiles)

__all__ = ["TrialPlan", "Measured", "run_trials", "run_steps", "trial_row", "latency_of", "drain", "backlog",
           "LATENCIES"]

#: What the ``latency`` column of a trial says its percentiles are: the lab server's own timing
#: of a request, a ``Server-Timing`` header's duration, or the client's (send to last byte).
LATENCIES = ("server", "server-timing", "client")

# Seconds a server has, once it accepts connections, to settle (every worker loaded) and to answer a warm-up
# request on every worker.
_WARM_TIMEOUT = 120.0
# Seconds a warm-up request may wait for its answer. The first warm-up round is one request per connection
# and ends by then: a server that answers none of them (an app that hangs in every request) fails the trial
# within this bound, before any measured load - not after the load's own timeouts, nor the server's (Gunicorn
# replaces a worker silent for 120 s).
_WARM_REQUEST_TIMEOUT = 30.0
# Requests one connection of the load generator carries before it reconnects. Workers that share one listening
# socket (uvicorn's, an asyncio server's) each accept what they can: a worker that accepts a burst of keep-alive
# connections at the start would serve the whole trial while the others idle. A new connection goes to a worker
# that is waiting in accept, so reconnecting often enough lets the kernel hand the load to every worker.
_REUSE = 8
# CPU seconds a worker must gain during the warm-up to count as having answered some (answers without a PID).
_SERVED = 0.005
# The server is idle when no process's main thread gains more than _IDLE_CPU seconds in _QUIET seconds
# (a sync worker's and Gunicorn's master's own timers cost far less), and nothing is queued at its port.
_QUIET = 0.3
_IDLE_CPU = 0.005
# Seconds a server tuna_lab started may take to settle before its warm-up (its workers loading their app).
_SETTLE_TIMEOUT = 60.0
# Seconds a step of run_steps waits for the last step's backlog to be served; past it a started server is
# restarted, and a running one's step fails.
_DRAIN_TIMEOUT = 30.0
# Server restarts one run_steps may make for steps that would start on a backlog.
_RESTARTS = 3
# Loads of one trial that may be sent again after a load that left a worker out (issue 47's rule): where a
# keep-alive connection lands is the kernel's draw, not the policy's doing, so the trial gets fresh connections
# rather than failing; each refused load is said in the row (``reloads``, ``reload_reason``) and the progress
# line, and the trial fails when the last one also leaves a worker out (a server that gives one worker
# everything is then told so, as before).
_RELOADS = 2


@dataclass(frozen=True)
class TrialPlan:
    """What the trials of one cell run: the same for every (trial, policy) but the policy and its place."""

    #: The cell's factors (:class:`~tuna_lab.measure.experiment.Config`).
    config: object
    #: What is measured (:class:`~tuna_lab.measure.target.Target`), started already.
    target: object
    #: One tuple of policies per trial, in the order they run.
    orders: tuple
    #: Closed loop: requests per trial (open loop: at most this many, or None).
    requests: int | None
    concurrency: int | None
    warmup: int
    #: CPUs the server may use (a column of every row, the C of the subscription W x T / C).
    cpus: int
    #: The load generator's CPUs and the server's machine (:class:`~tuna_lab.machine.reserve.ClientCpus`).
    client: object
    #: Open loop: mean arrivals per second, for ``duration`` seconds (None: closed loop).
    rate: float | None = None
    duration: float | None = None
    seed: int = 0
    #: Most failed requests (share of those sent) a valid trial may have.
    max_error_rate: float = 0.0
    #: Open loop: seconds each request may take once sent, and the drain after the last arrival
    #: (None: the load's default). A step of a search over rates is bounded by ``duration + timeout``.
    timeout: float | None = None
    #: ``(trial, policy)`` runs not to run: those a resume keeps from an earlier attempt of the cell.
    skip: frozenset = frozenset()

    @property
    def runs(self):
        """How many (trial, policy) runs the cell has (those skipped included)."""
        return sum(len(order) for order in self.orders)


@dataclass(frozen=True)
class Measured:
    """What one (trial, policy) run produced."""

    #: Its row of the trials table.
    row: dict
    #: Its request rows (empty when the server never served).
    requests: pd.DataFrame
    #: Its per-thread CPU accounting (None when it could not be accounted).
    threads: pd.DataFrame | None


def _labels(plan, trial, order, policy):
    """The columns that name a (trial, policy) in every table: the cell's factors, policy, trial, order."""
    config = plan.config
    return {"cell": config.key, "policy": policy, "workers": config.workers, "threads": config.threads,
            "cpus": plan.cpus, "model": config.model, "batch": config.batch, "wait_policy": config.wait_policy,
            "spincount": -1 if config.spincount is None else config.spincount, "trial": trial, "order": order}


def latency_of(frame, response):
    """Which latency a trial's percentiles are of (:data:`LATENCIES`), from its 2xx rows.

    The lab server's JSON (``response="lab"``) carries its own timing. A
    user's response counts as server-timed when a ``Server-Timing`` duration
    was read for some of its requests; otherwise the client's latency is all
    there is.
    """
    if response == "lab":
        return "server"
    if len(frame) and np.isfinite(frame["server_seconds"].to_numpy(float)).any():
        return "server-timing"
    return "client"


def _ok(frame):
    status = frame["status"].to_numpy()
    return (status >= 200) & (status < 300)


def trial_row(labels, frame, wall, status, reason, cpu=None, generator=None, latency="server"):
    """The trials-table row of one (trial, policy): counts, percentiles of ``latency``, CPU, generator cost."""
    ok = frame[_ok(frame)] if len(frame) else frame
    column = "client_seconds" if latency == "client" else "server_seconds"
    values = ok[column].to_numpy(float) if len(ok) else np.array([])
    values = values[np.isfinite(values)]
    client = ok["client_seconds"].to_numpy(float) if len(ok) else np.array([])
    row = {**labels, "n": int(len(frame)), "ok": int(len(ok)), "failed": int(len(frame) - len(ok)),
           "wall_seconds": wall, "trial_status": status, "reason": reason, "latency": latency}
    row.update(dict.fromkeys(PHASE_COLUMNS, float("nan")))
    row.update(dict.fromkeys(FAULT_COLUMNS, 0))
    row.update(dict.fromkeys(BALANCE_COLUMNS, float("nan")))
    row["reload_reason"] = ""
    row.update(dict.fromkeys(CPU_COLUMNS, float("nan")))
    row.update(dict.fromkeys(EVIDENCE_COLUMNS, float("nan")))
    row.update(cpu or {})
    row.update(_generator_columns(generator, len(frame)))
    row.update(percentiles(values))
    row.update({k: v for k, v in percentiles(client[np.isfinite(client)], prefix="client").items()
                if k in ("client_p50", "client_p99")})
    row["throughput"] = row["ok"] / wall if wall > 0 else float("nan")
    return row


def run_trials(plan):
    """Run every (trial, policy) of ``plan`` in its order but those in ``plan.skip``, yielding a
    :class:`Measured` as each finishes.

    A generator, so that the caller holds every finished run when Ctrl-C
    stops the one in progress (whose server the target's context manager stops).
    """
    from ..machine.topology import Topology

    topo = Topology.from_sysfs()
    for trial, order in enumerate(plan.orders):
        for pos, policy in enumerate(order):
            if (trial, policy) not in plan.skip:
                yield from _measure(plan, _labels(plan, trial, pos, policy), topo)


def run_steps(plan, policy, steps, trial=0):
    """One server start under ``policy``, then an open-loop load per step that ``steps`` names.

    The server is started, warmed up and placed as for a trial of
    :func:`run_trials` (a placement not in effect fails before any step);
    then ``steps(None)`` names the first step's ``(rate, duration)`` and
    ``steps(row)`` the next one from the last step's trials-table row, until
    it returns None. Starting a server once for several rates is what makes a
    search over rates (:mod:`tuna_lab.measure.tune.tuner`) affordable. Steps are
    independent: before each one the server is drained (:func:`drain`) of
    what the last step left queued; a server that does not drain within
    30 s is restarted (warmed and placed again) and the step runs on the
    fresh one, so no step is measured on a backlog. A running server, which
    cannot be restarted, fails the step instead when requests are still
    queued at its port (its ``reason`` says how many); one that is only busy
    (serving others' traffic) is measured. A generator:
    each step's :class:`Measured` is yielded as it finishes, its ``trial``
    being ``trial`` plus the step's index, so every step is a trial of its own
    in the records.

    Examples
    --------
    >>> rates = iter([(5.0, 2.0), (10.0, 2.0)])
    >>> # skipped: needs a trial plan, which starts a lab server
    >>> for m in run_steps(plan, "cfs", lambda row: next(rates, None)):   # doctest: +SKIP
    ...     print(m.row["trial"], m.row["client_p99"])
    """
    from ..machine.topology import Topology

    yield from _measure(plan, _labels(plan, trial, 0, policy), Topology.from_sysfs(), steps)


def _thread_cpu(pids):
    """``{pid: {tid: CPU seconds}}`` of every thread of the processes ``pids`` (schedstat), read now."""
    out = {}
    for pid in pids:
        try:
            out[pid] = procfs.thread_cpu(pid)
        except OSError:
            continue
    return out


def _main_cpu(pids):
    """``{pid: CPU seconds}`` of each process's main thread (schedstat), read now; gone processes left out."""
    out = {pid: procfs.thread_cpu_seconds(pid, pid) for pid in pids}
    return {pid: seconds for pid, seconds in out.items() if seconds is not None}


def backlog(port):
    """Requests waiting at the local TCP ``port``, read from ``/proc/net/tcp`` and ``tcp6``.

    Connections the server has not accepted yet (a listening socket's
    receive queue is its accept backlog) plus accepted ones with request
    bytes it has not read, including those whose client gave up (a closed
    connection's request is still served by a sync worker).

    Examples
    --------
    >>> backlog(1)
    0
    """
    # 0A: LISTEN, whose receive queue is its accept backlog; any other socket counts once if it has bytes unread
    return sum(rx if state == "0A" else int(rx > 0) for local, state, rx in procfs.tcp_sockets() if local == port)


def drain(live, url, timeout=_DRAIN_TIMEOUT):
    """Wait until the server of ``live`` is idle: ``(True, 0, [])``, or after ``timeout`` s ``(False, queued, busy)``.

    Idle, measured: nothing queued at the port of ``url`` (:func:`backlog`),
    and no process of the server (master and workers) whose main thread
    gained more than 5 ms of CPU in the last 0.3 s. A worker still loading
    its app, or serving a backlog its clients gave up on, is busy.
    """
    from urllib.parse import urlsplit

    port = urlsplit(url).port or 80
    deadline = time.monotonic() + timeout
    pids = [p for p in (live.master_pid(), *live.worker_pids()) if p]
    last = _main_cpu(pids)
    while True:
        time.sleep(_QUIET)
        now = _main_cpu(pids)
        busy = sorted(pid for pid in now if now[pid] - last.get(pid, now[pid]) > _IDLE_CPU)
        queued = backlog(port)
        if not busy and not queued:
            return True, 0, []
        if time.monotonic() >= deadline:
            return False, queued, busy
        last = now


def _warm_up(plan, live, url, body, options, pin):
    """Settle the server, then warm every worker up; ``{pid: {tid: CPU seconds gained}}`` over the warm-up.

    Rounds of at least ``2 W`` concurrent requests (and ``plan.warmup`` in
    all) go until every worker answered some: by the PID an answer carries
    (the lab server's), else by the worker's CPU time growing - measured
    from a settled server, so a worker still loading its app does not count.
    Raises :class:`_NotPlaced` when a worker answers none within 120 s, and
    at once when nothing answers the first round (one request per
    connection, each waiting up to 30 s): no response at all, only timeouts
    or refused connections. A round none of whose requests succeeded but
    that the server did answer (an HTTP error) ends the warm-up: the load
    that follows fails, and says what the server answered.
    """
    from .loadgen.load import closed_loop

    deadline = time.monotonic() + _WARM_TIMEOUT
    while len(live.worker_pids()) < plan.config.workers and time.monotonic() < deadline:
        time.sleep(0.1)                            # a worker forked late (a replacement, a slow master)
    # A server tuna_lab started settles once every worker loaded its app; a running one (which may serve
    # others meanwhile) is given a few seconds to serve what an earlier trial left queued.
    drain(live, url, _SETTLE_TIMEOUT if plan.target.restarts else 5.0)
    pids = live.worker_pids()
    before = _thread_cpu(pids)
    if not plan.warmup:
        return {pid: {} for pid in pids}
    concurrency = max(min(plan.warmup, 4), 2 * len(pids))
    served, sent = set(), 0
    while True:
        # The first round is one request per connection, bounded as a whole: it tells whether anything answers.
        n = concurrency if not sent else max(plan.warmup - sent, concurrency)
        bound = {"deadline": _WARM_REQUEST_TIMEOUT + 1.0} if not sent else {}
        frame = closed_loop(url, body, requests=n, concurrency=concurrency, cpus=pin,
                            timeout=_WARM_REQUEST_TIMEOUT, reuse=_REUSE, **bound, **options)
        if not sent:
            _check_answered(frame)
        sent += n
        ok = frame[_ok(frame)] if len(frame) else frame
        served |= {int(p) for p in ok["pid"].to_numpy() if p > 0} if len(ok) else set()
        after = _thread_cpu(pids)
        gains = {pid: {tid: cpu - before.get(pid, {}).get(tid, 0.0) for tid, cpu in tids.items()}
                 for pid, tids in after.items()}
        served |= {pid for pid, tids in gains.items() if sum(tids.values()) >= _SERVED}
        idle = [pid for pid in pids if pid not in served and psutil.pid_exists(pid)]
        if (not idle and sent >= plan.warmup) or not len(ok):
            return gains
        if time.monotonic() >= deadline:
            raise _NotPlaced(f"worker{'s' if len(idle) > 1 else ''} {', '.join(map(str, idle))} answered none of "
                             f"the {sent} warm-up requests within {_WARM_TIMEOUT:g} s")


def _check_answered(frame):
    """Raise :class:`_NotPlaced` when the server answered none of ``frame``'s requests (no HTTP status at all).

    Examples
    --------
    >>> _check_answered(pd.DataFrame({"status": [500, -1], "error": ["oops", "timeout"]}))    # an answer: go on
    >>> _check_answered(pd.DataFrame({"status": [-1, -1], "error": ["timeout", "timeout"]}))
    Traceback (most recent call last):
    ...
    tuna_lab.measure.trials._NotPlaced: nothing answered: none of the 2 warm-up requests got a response (timeout after 30 s); the server accepts connections but its app answers no request
    """
    if not len(frame) or (frame["status"].to_numpy() >= 0).any():
        return
    errors = [e for e in frame["error"].to_numpy(dtype=object) if e]
    why = max(set(errors), key=errors.count) if errors else "no response"
    if why in ("timeout", "deadline"):
        why = f"timeout after {_WARM_REQUEST_TIMEOUT:g} s"
        what = "the server accepts connections but its app answers no request"
    else:
        what = "the server did not answer"
    raise _NotPlaced(f"nothing answered: none of the {len(frame)} warm-up requests got a response ({why}); {what}")


def _short_pools(live, threads):
    """Workers whose pool was not found: ``{pid: pool threads found}`` where fewer than ``threads - 1``."""
    if threads < 2:
        return {}
    found = {}
    for t in live.server_threads():
        found.setdefault(t["pid"], 0)
        found[t["pid"]] += thread_role(t["role"]) == "pool"
    return {pid: n for pid, n in found.items() if n < threads - 1}


def _prepare(plan, live, url, body, options, pin):
    """Warm every worker up, place and verify; a worker whose pool was not found is warmed and placed again."""
    activity = _warm_up(plan, live, url, body, options, pin)
    problems = live.place(activity)
    if not problems and _short_pools(live, plan.config.threads):
        # A pool that starts at a worker's first requests: one more warm-up, and the placement again.
        again = _warm_up(plan, live, url, body, options, pin)
        merged = {pid: {tid: again.get(pid, {}).get(tid, 0.0) + activity.get(pid, {}).get(tid, 0.0)
                        for tid in set(again.get(pid, {})) | set(activity.get(pid, {}))}
                  for pid in set(again) | set(activity)}
        problems = live.place(merged)
        short = _short_pools(live, plan.config.threads)
        if short:
            live.warnings.append("pool not found (fewer than T-1 pool threads) in worker(s) "
                                 + ", ".join(f"{pid} ({n})" for pid, n in sorted(short.items())))
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise _NotPlaced(f"placement not in effect: {problems[0]}{more}")


def _load(plan, url, body, options, pin):
    from .loadgen.load import closed_loop, open_loop

    if plan.rate is not None:
        bound = {} if plan.timeout is None else {"timeout": plan.timeout, "deadline": plan.duration + plan.timeout}
        return open_loop(url, body, plan.rate, requests=plan.requests, duration=plan.duration, seed=plan.seed,
                         cpus=pin, reuse=_REUSE, **bound, **options)
    return closed_loop(url, body, requests=plan.requests, concurrency=plan.concurrency, cpus=pin, reuse=_REUSE,
                       **options)


def _measure(plan, labels, topo, steps=None):
    """One (trial, policy): apply the policy, warm up, place and verify, load while sampling CPU, release.

    A generator of :class:`Measured`: one for the trial, or with ``steps``
    (see :func:`run_steps`) one per open-loop step on the same server, each
    begun on a drained server (restarted when it does not drain).
    """
    target, spec = plan.target, plan.target.requests
    options, body = spec.load_options(), spec.body()
    # The generator runs pinned to the client CPUs only while it sends (unpinned when none are kept).
    pin = plan.client.cpus or None
    here, mine = plan, labels
    if steps is not None:
        step = steps(None)
        if step is None:
            return
        here = replace(plan, rate=float(step[0]), duration=float(step[1]))
    index, restarts = 0, 0
    while True:
        done, restart = [], False
        # Start-up, warm-up and stop are timed apart from the load: a slow start is not a slow server.
        phases = dict.fromkeys(PHASE_COLUMNS, float("nan"))
        t0 = time.monotonic()
        try:
            with target.apply(labels["policy"]) as live:
                t1 = time.monotonic()
                phases["startup_seconds"] = t1 - t0
                url = spec.url_on(live.url)
                # Who serves as the warm-up begins: a worker replaced, or a master gone, from here on is a fault.
                server = _identity(live)
                _prepare(here, live, url, body, options, pin)
                target.observe(live)
                phases["warmup_seconds"] = time.monotonic() - t1
                fresh = True
                while True:
                    if not fresh:
                        drained, queued, _ = drain(live, url, _DRAIN_TIMEOUT)
                        if not drained and target.restarts and restarts < _RESTARTS:
                            restart = True             # the step is run on a fresh server instead
                            break
                        if queued:
                            raise _NotPlaced(f"the server still had {queued} requests queued {_DRAIN_TIMEOUT:g} s "
                                             "after the last step: this step would start on a backlog")
                    fresh = False
                    measured, server = _loaded(here, mine, topo, live, url, body, options, pin, server)
                    if steps is None:
                        measured, server = _reloaded(here, mine, topo, live, url, body, options, pin, server,
                                                     measured)
                    measured.row.update(phases)
                    if steps is None:
                        # Given out once the server is stopped: an error while stopping it fails the trial.
                        done.append(measured)
                        break
                    yield measured
                    index += 1
                    step = steps(measured.row)
                    if step is None:
                        break
                    here = replace(plan, rate=float(step[0]), duration=float(step[1]))
                    mine = {**labels, "trial": labels["trial"] + index}
                t_stop = time.monotonic()
            for measured in done:
                measured.row["stop_seconds"] = time.monotonic() - t_stop
        except TunaError as exc:
            done = [_measured(here, mine, status="failed", reason=one_line(exc))]
            done[0].row.update(phases)
        except _NotPlaced as exc:
            done = [_measured(here, mine, status="failed", reason=str(exc))]
            done[0].row.update(phases)
        yield from done
        if not restart:
            return
        restarts += 1


def _reloaded(plan, labels, topo, live, url, body, options, pin, server, measured):
    """``measured``, or a load sent again (at most :data:`_RELOADS` times) when it left a worker out.

    Only a load refused by the worker-share rule alone is sent again - the
    server alive, no worker replaced, nothing still queued at its port - on
    the same warm, placed server and fresh connections. The row of the load
    kept says how many were refused before it (``reloads``) and the first one's
    reason (``reload_reason``): nothing is dropped without a word.
    """
    refused = []
    while (_left_out(measured.row) and len(refused) < _RELOADS and live.alive()
           and drain(live, url, _DRAIN_TIMEOUT)[0]):
        refused.append(measured.row["reason"])
        measured, server = _loaded(plan, labels, topo, live, url, body, options, pin, server)
    measured.row["reloads"] = len(refused)
    measured.row["reload_reason"] = refused[0] if refused else ""
    return measured, server


def _left_out(row):
    """Whether the trial row ``row`` failed by the worker-share rule alone (see :func:`_unbalanced`)."""
    return (row["trial_status"] == "failed" and row["worker_share"] < fair_share()
            and not row["workers_replaced"] and not row["master_restarted"])


def _loaded(plan, labels, topo, live, url, body, options, pin, server):
    """One load on a placed, warm server, every server thread's CPU time sampled meanwhile.

    ``server`` is :func:`_identity` before it (at the warm-up's start); returns the
    :class:`Measured` and the identity after it, for a next step on the same server.
    """
    status, reason = "ok", ""
    threads = live.server_threads()
    workers = live.worker_pids()
    # The scheduler's evidence is read just outside the CPU sampling, so that its cost is not in the load.
    evidence = SchedEvidence(live.master_pid(), threads).start()
    # Issue 50: a server with no per-request hook (run --pid) has its threads' counters sampled instead.
    sched = plan.target.sched_sampler(threads)
    with CpuSampler(threads, period=0.1) as sampler, sched:
        t0 = time.monotonic()
        frame = _load(plan, url, body, options, pin)
        wall = time.monotonic() - t0
    # Read before the server stops: where its threads ran, and what the scheduler did to them.
    evidence.stop()
    frame = sched.fill(frame)
    # frame.attrs does not survive every pandas operation: keep what the load said now.
    generator = dict(frame.attrs.get("generator") or {})
    timing = dict(frame.attrs.get("server_timing") or {})
    # Where the server's threads may run, off the generator's CPUs when client CPUs are kept.
    allowed = evidence.allowed()
    generator["server_cpus"] = sorted(set().union(*allowed.values())) if allowed else []
    alive = live.alive()
    after = _identity(live)
    faults = _faults(server, after, frame, alive)
    if not alive:
        status, reason = "failed", "the server died during the trial"
    elif faults["master_restarted"]:
        status, reason = "failed", "the server's master was restarted during the trial"
    elif faults["workers_replaced"]:
        n = faults["workers_replaced"]
        status, reason = "failed", (f"{n} worker{'s' if n > 1 else ''} replaced during the trial (a replacement's "
                                    "start-up and warm-up fall inside it)")
    cpu, per_thread = _cpu_of(sampler, frame, labels, evidence)
    share, least, by = worker_balance(per_thread, frame, workers)
    if status == "ok" and share < fair_share():
        status, reason = "failed", _unbalanced(share, least, by, len(workers))
    if per_thread is not None:
        per_thread, cpu["numa_locality"] = _with_locality(per_thread, topo)
        per_thread = per_thread.assign(cpus=[format_cpulist(allowed.get((pid, role), ()))
                                             for pid, role in zip(per_thread["pid"], per_thread["role"])])
    measured = _measured(plan, labels, frame, wall, status, reason, cpu, generator, per_thread, timing)
    measured.row.update(faults)
    measured.row.update(sched.columns())
    measured.row["worker_share"] = share
    return measured, after


def _unbalanced(share, least, by, workers):
    """The reason of a trial whose load did not reach every worker (see :func:`worker_balance`)."""
    what = "requests" if by == "requests" else "CPU time"
    return (f"a worker left out of the load: worker {least} did {share:.0%} of the busiest worker's {what} (each "
            f"of the {workers} must do at least {fair_share():.0%}): the kernel gave the load generator's "
            "connections to the others, and the trial measured fewer workers than the server has")


def _identity(live):
    """Who serves now: ``(master, its start time or None when gone, frozenset of worker PIDs)``."""
    master = live.master_pid()
    try:
        born = psutil.Process(master).create_time() if master else None
    except psutil.Error:
        born = None
    return master, born, frozenset(live.worker_pids())


def _faults(before, after, frame, alive):
    """The trial's :data:`~tuna_lab.measure.schema.FAULT_COLUMNS` from :func:`_identity` before and after it.

    A worker that served a request but was not there at the start counts as
    new too (it may have come and gone in between). Once the master is gone,
    its workers went with it: only new workers count then.
    """
    served = set()
    if len(frame) and "pid" in frame.columns:
        served = {int(p) for p in frame["pid"].to_numpy() if p > 0}
    restarted = int(not alive or (before[1] is not None and after[1] != before[1]))
    new = (after[2] | served) - before[2]
    gone = before[2] - after[2]
    return {"workers_replaced": len(new) if restarted else max(len(new), len(gone)), "master_restarted": restarted}


def _measured(plan, labels, frame=None, wall=0.0, status="ok", reason="", cpu=None, generator=None, per_thread=None,
              timing=None):
    """The :class:`Measured` of one load: the error-rate rule applied, the rows labelled."""
    frame = pd.DataFrame() if frame is None else frame
    timing = timing or {}
    latency = latency_of(frame, plan.target.requests.response)
    if len(frame) and status == "ok":
        failed = ~_ok(frame)
        share = failed.mean()
        if share > plan.max_error_rate:
            bad = frame.loc[failed, "error"].iloc[0] or f"HTTP {frame.loc[failed, 'status'].iloc[0]}"
            status = "failed"
            reason = (f"{int(failed.sum())} of {len(frame)} requests failed ({share:.1%}, more than the "
                      f"{plan.max_error_rate:.1%} allowed): {bad}")
    if len(frame):
        frame = frame.assign(**labels, load_mode="open" if plan.rate is not None else "closed", latency=latency)
    row = trial_row(labels, frame, wall, status, reason, cpu, generator, latency)
    # a tuna-* policy whose families admit no mapping: what its relaxed mapping exceeds ("" otherwise)
    row["relaxed"] = plan.target.relaxed(labels["policy"])
    row["server_timing_unparsed"] = int(timing.get("unparsed") or 0)
    row["server_timing_example"] = timing.get("example") or ""
    return Measured(row, frame, per_thread)


class _NotPlaced(Exception):
    """The trial cannot start as measured: a worker not warmed, a placement not in effect, a backlog.

    The trial fails before its load, with this as its reason.
    """


def _generator_columns(generator, requests=0):
    """The trial row's :data:`GENERATOR_COLUMNS` from a load frame's ``attrs["generator"]`` (NaN if absent)."""
    row = dict.fromkeys(GENERATOR_COLUMNS, float("nan"))
    row["generator_cpus"] = ""
    row["server_cpus"] = format_cpulist((generator or {}).get("server_cpus") or ())
    # The loop that sent the load (wire.drive's): "c", or "python: why" - a cost figure names its instrument.
    engine, why = (generator or {}).get("engine", ""), (generator or {}).get("engine_why", "")
    row["generator_engine"] = f"{engine}: {why}" if engine and why else engine
    if not generator or "cpu_seconds" not in generator:
        return row
    sent = generator.get("requests") or requests
    seconds = float(generator.get("cpu_seconds", float("nan")))
    row.update(generator_cpu_user=float(generator.get("cpu_user", float("nan"))),
               generator_cpu_sys=float(generator.get("cpu_sys", float("nan"))), generator_cpu_seconds=seconds,
               generator_cpu_per_request=seconds / sent if sent else float("nan"),
               generator_cpus=format_cpulist(generator.get("cpus") or ()),
               generator_processes=float(generator.get("processes", float("nan"))),
               generator_wall_seconds=float(generator.get("wall_seconds", float("nan"))))
    return row


def _cpu_of(sampler, frame, labels, evidence):
    """A trial's CPU summary with its scheduler evidence, and its per-thread table (``(None, None)`` if not
    accountable)."""
    ok = int(_ok(frame).sum()) if len(frame) else 0
    try:
        threads = account(sampler, frame, evidence)
    except CpuAccountingError:
        return evidence.columns(ok), None
    cpu = {**summarize_threads(threads, ok), **evidence.columns(ok)}
    if not len(frame) or not np.isfinite(frame["server_start"].to_numpy(float)).any():
        # A user's server does not say when it began each request: busy and idle time cannot be told apart.
        cpu.update({k: float("nan") for k in cpu if k.startswith("idle_cpu_share_")})
    cpu["load_seconds"] = float(sampler.times[-1] - sampler.times[0])
    threads = threads.assign(**{k: labels[k] for k in ("cell", "policy", "trial", "wait_policy")})
    return cpu, threads


def _with_locality(per_thread, topo):
    """Add each worker's NUMA locality (share of its resident pages on its main thread's node)."""
    from ..machine.numa import worker_locality

    found = {}
    for pid in per_thread["pid"].unique():
        try:
            loc = worker_locality(int(pid), topo)
            found[pid] = (loc.node, loc.share)
        except TunaError:                      # the worker is gone, or /proc hides it: unknown
            found[pid] = (-1, float("nan"))
    per_thread = per_thread.assign(numa_node=per_thread["pid"].map(lambda p: found[p][0]),
                                   numa_locality=per_thread["pid"].map(lambda p: found[p][1]))
    shares = [share for _, share in found.values()]
    return per_thread, float(np.nanmean(shares)) if np.isfinite(shares).any() else float("nan")
