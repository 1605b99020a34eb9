"""``tuna-lab bench sampler``: what ``run --pid``'s sampler of scheduler counters costs a loaded server.

A server measured with ``run --pid`` has its threads' scheduler counters read
by :class:`~tuna_lab.measure.sampled.SchedSampler`, a thread of the measuring
process, at ``--sample-hz`` (issue 50). On a 2-CPU machine that CPU is taken
from the server it measures, so issue 50 bounds it: at most
:data:`TARGET` (2 %) of the server's CPU per request.

This bench starts one real tuna_lab server (by default W=2, T=1, the small
model, batch 10: the cheapest request, so the largest share), and runs
closed loops of a fixed length against it in rounds, each round once with
the sampler on every thread of the workers (as ``run --pid`` samples them)
and once without, the order alternating. Per run it records requests/s, the
workers' CPU (every thread's, from ``/proc``) and the sampler's own
(``SchedSampler.cpu_seconds``: its thread's CPU time, the first and last
readings included). Per request, the sampler's share is its CPU over the
workers' CPU in the same run (the same requests); the check is on the median
over the rounds. Its share of one CPU (CPU seconds per second of load) and
the cost of one sample are printed beside it; the runs without the sampler
show what the server did without it.

This is a benchmark, not a test: PASS/FAIL is printed and the exit status is
0 when it measured; other work on the machine shows in the numbers (the load
average is printed).

Examples
--------
>>> # skipped: starts a lab server for about 40 seconds (make bench)
>>> from tuna_lab.bench.sampler import measure_sampler    # doctest: +SKIP
>>> measure_sampler(rounds=1, duration=2.0)["checks"]      # doctest: +SKIP
{'share_of_server_cpu': True}
"""

import os
import statistics
import time

from .. import _files
from .._checks import positive_int, positive_number
from ..errors import LoadError
from ._measured import header, measure_and_write

__all__ = ["TARGET", "measure_sampler", "format_table", "run_sampler_bench"]

#: Issue 50's bound: the sampler's CPU at most this share of the server's CPU per request.
TARGET = 0.02


def _server_cpu(pids):
    """CPU seconds of every thread of the processes ``pids`` so far (a thread gone meanwhile is left out)."""
    from ..machine.procfs import thread_cpu

    total = 0.0
    for pid in pids:
        try:
            total += sum(thread_cpu(pid).values())
        except OSError:
            pass
    return total


def _threads(pids):
    """Every thread of the workers ``pids``, as ``run --pid`` samples them: a worker's main thread is ``main``."""
    from ..machine.procfs import thread_ids

    return [{"pid": pid, "tid": tid, "role": "main" if tid == pid else "other"}
            for pid in pids for tid in thread_ids(pid)]


def _run(url, body, connections, duration, rate, pids, hz):
    """One closed loop of about ``duration`` seconds; with ``hz``, the workers' threads sampled meanwhile."""
    from ..measure.loadgen.load import closed_loop
    from ..measure.sampled import NoSampler, SchedSampler

    threads = _threads(pids)
    sampler = SchedSampler(threads, hz=hz) if hz else NoSampler()
    n = max(10 * connections, round(rate * duration))
    cpu0 = _server_cpu(pids)
    t0 = time.monotonic()
    with sampler:
        frame = closed_loop(url, body, requests=n, concurrency=connections, timeout=30.0,
                            deadline=max(60.0, 4 * duration))
    wall = time.monotonic() - t0
    server = _server_cpu(pids) - cpu0
    ok = int(((frame["status"] >= 200) & (frame["status"] < 300)).sum())
    spent = getattr(sampler, "cpu_seconds", 0.0)
    samples = len(sampler.times) if hz else 0
    return {"sampler": "on" if hz else "off", "hz": float(hz or 0.0), "threads": len(threads), "requests": ok,
            "errors": len(frame) - ok, "wall_seconds": wall, "rps": ok / wall if wall > 0 else 0.0,
            "server_cpu_seconds": server, "server_cpu_per_request": server / ok if ok else float("nan"),
            "sampler_cpu_seconds": spent, "samples": samples,
            "sampler_share_of_server": spent / server if hz and server > 0 else float("nan"),
            "sampler_share_of_one_cpu": spent / wall if hz and wall > 0 else float("nan"),
            "sampler_us_per_sample": 1e6 * spent / samples if samples else float("nan")}


def measure_sampler(workers=2, threads=1, model="small", batch=10, connections=8, duration=4.0, rounds=3,
                    hz=None, log=None):
    """Closed loops against one lab server, each round with and without the sampler; the medians and the check.

    Parameters
    ----------
    workers, threads : int
        The lab server's workers and OpenMP threads per worker.
    model : {"small", "medium", "large"}
    batch : int
        Rows per request.
    connections : int
        Requests in flight.
    duration : float
        Seconds of each run (its requests are what the last run's rate gives in that time).
    rounds : int
        Rounds of one run with the sampler and one without, the order alternating.
    hz : float, optional
        The sampling rate (default :data:`~tuna_lab.measure.sampled.DEFAULT_HZ`, ``run --pid``'s).
    log : callable, optional
        Called with one line per run.

    Returns
    -------
    dict
        ``rows`` (one dict per run), ``medians`` (of the runs with the
        sampler: its share of the server's CPU and of one CPU, µs per sample,
        requests/s; and of those without: requests/s, server CPU per request),
        ``checks`` (``share_of_server_cpu``: the median share at most
        :data:`TARGET`), ``config`` and ``load_average`` (before, after).
    """
    from ..measure.loadgen.load import closed_loop, payload, summary
    from ..measure.sampled import DEFAULT_HZ, check_hz
    from ..server.launch import Server

    rounds = positive_int("rounds", rounds, LoadError)
    connections = positive_int("connections", connections, LoadError)
    duration = positive_number("duration", duration, LoadError)
    hz = check_hz(DEFAULT_HZ if hz is None else hz)
    log = log or (lambda line: None)
    body = payload(model, batch)
    load_before = os.getloadavg()
    rows = []
    with Server(workers, threads, model=model, die_with_parent=True) as srv:
        url = f"{srv.url}/predict"
        warm = summary(closed_loop(url, body, requests=max(100, 4 * connections), concurrency=connections,
                                   timeout=30.0, deadline=120.0))
        rate = warm["throughput"] if warm["ok"] else 100.0
        pids = sorted(srv.worker_pids())
        for k in range(rounds):
            for on in ((True, False) if k % 2 == 0 else (False, True)):
                row = _run(url, body, connections, duration, rate, pids, hz if on else None)
                row["round"] = k + 1
                rows.append(row)
                if row["rps"] > 0:
                    rate = row["rps"]
                share = (f"sampler {1e3 * row['sampler_cpu_seconds']:6.1f} ms CPU = "
                         f"{100 * row['sampler_share_of_server']:5.2f} % of the server's, "
                         f"{100 * row['sampler_share_of_one_cpu']:5.2f} % of one CPU" if on else "no sampler")
                log(f"round {k + 1} {row['rps']:7.1f} req/s  server {1e3 * row['server_cpu_per_request']:6.2f} ms "
                    f"CPU/request  {share}")
    on = [r for r in rows if r["sampler"] == "on" and r["requests"]]
    off = [r for r in rows if r["sampler"] == "off" and r["requests"]]
    medians = {}
    if on:
        medians["on"] = {key: statistics.median(r[key] for r in on)
                         for key in ("rps", "server_cpu_per_request", "sampler_share_of_server",
                                     "sampler_share_of_one_cpu", "sampler_us_per_sample", "threads")}
    if off:
        medians["off"] = {key: statistics.median(r[key] for r in off) for key in ("rps", "server_cpu_per_request")}
    checks = {"share_of_server_cpu": medians["on"]["sampler_share_of_server"] <= TARGET} if on else {}
    return {"rows": rows, "medians": medians, "checks": checks,
            "config": {"workers": workers, "threads": threads, "model": model, "batch": batch,
                       "connections": connections, "duration": duration, "rounds": rounds, "hz": hz},
            "load_average": [load_before, os.getloadavg()]}


def format_table(result):
    """The bench's result as lines of text: every run, the medians and the verdict.

    Examples
    --------
    >>> row = {"sampler": "on", "round": 1, "threads": 2, "requests": 500, "rps": 100.0,
    ...        "server_cpu_per_request": 0.01, "sampler_cpu_seconds": 0.05, "sampler_share_of_server": 0.01,
    ...        "sampler_share_of_one_cpu": 0.01, "sampler_us_per_sample": 100.0}
    >>> result = {"rows": [row], "checks": {"share_of_server_cpu": True}, "config": {"hz": 100.0},
    ...           "medians": {"on": {"rps": 100.0, "server_cpu_per_request": 0.01, "sampler_share_of_server": 0.01,
    ...                              "sampler_share_of_one_cpu": 0.01, "sampler_us_per_sample": 100.0,
    ...                              "threads": 2}}}
    >>> format_table(result)[-1]
    'sampler at 100 Hz: 1.00 % of the server CPU per request (median), target <= 2 %   PASS'
    """
    head = (f"{'sampler':7s} {'round':>5s} {'threads':>7s} {'requests':>8s} {'req/s':>7s} {'server ms/req':>13s} "
            f"{'sampler ms':>10s} {'% server':>8s} {'% 1 CPU':>7s} {'us/sample':>9s}")
    lines = [head, "-" * len(head)]

    def pct(x):
        return f"{100 * x:8.2f}" if x == x else f"{'-':>8s}"

    for r in result["rows"]:
        on = r["sampler"] == "on"
        lines.append(f"{r['sampler']:7s} {r['round']:5d} {r['threads']:7d} {r['requests']:8d} {r['rps']:7.1f} "
                     f"{1e3 * r['server_cpu_per_request']:13.2f} "
                     + (f"{1e3 * r['sampler_cpu_seconds']:10.1f} {pct(r['sampler_share_of_server'])} "
                        f"{100 * r['sampler_share_of_one_cpu']:7.2f} {r['sampler_us_per_sample']:9.1f}" if on
                        else f"{'-':>10s} {'-':>8s} {'-':>7s} {'-':>9s}"))
    lines.append("-" * len(head))
    hz = result["config"]["hz"]
    m = result["medians"]
    if "off" in m:
        lines.append(f"without the sampler (median): {m['off']['rps']:.1f} req/s, "
                     f"{1e3 * m['off']['server_cpu_per_request']:.2f} ms of server CPU per request")
    if "on" in m:
        o = m["on"]
        lines += [f"with the sampler (median): {o['rps']:.1f} req/s, {1e3 * o['server_cpu_per_request']:.2f} ms of "
                  f"server CPU per request; the sampler {100 * o['sampler_share_of_one_cpu']:.2f} % of one CPU, "
                  f"{o['sampler_us_per_sample']:.0f} us per sample of {o['threads']:g} threads",
                  f"sampler at {hz:g} Hz: {100 * o['sampler_share_of_server']:.2f} % of the server CPU per request "
                  f"(median), target <= {100 * TARGET:g} %   "
                  f"{'PASS' if result['checks']['share_of_server_cpu'] else 'FAIL'}"]
    else:
        lines.append("no run with the sampler served a request: nothing measured")
    return lines


def _write_doc(path, result, lines):
    c = result["config"]
    before, after = result["load_average"]
    text = ("# Sampler benchmark\n\n"
            f"`tuna-lab bench sampler` on {time.strftime('%Y-%m-%d')}: the lab server W={c['workers']}, "
            f"T={c['threads']}, model {c['model']}, batch {c['batch']}, {c['connections']} connections, "
            f"{c['rounds']} rounds of {c['duration']:g} s with and without the sampler at {c['hz']:g} Hz; load "
            f"average before / after: {' '.join(f'{x:.2f}' for x in before)} / "
            f"{' '.join(f'{x:.2f}' for x in after)}. What it measures: `tuna_lab.bench.sampler`.\n\n"
            "```text\n" + "\n".join(lines) + "\n```\n")
    _files.write_atomic(path, text, parents=True)


def run_sampler_bench(args):
    """``tuna-lab bench sampler``: run :func:`measure_sampler` from parsed arguments; print, write CSV and doc.

    Returns 0 when it measured (PASS or FAIL is printed), 1 when no run with the sampler served a request.

    Examples
    --------
    >>> from tuna_lab.cli import main
    >>> # skipped: starts a lab server for about 40 seconds
    >>> main(["bench", "sampler", "--rounds", "1"])   # doctest: +SKIP
    0
    """
    from ..measure.sampled import check_hz

    for name in ("workers", "threads", "batch", "connections", "rounds"):
        positive_int(name, getattr(args, name), LoadError)
    positive_number("duration", args.duration, LoadError)
    if args.sample_hz is not None:
        check_hz(args.sample_hz)
    header("sampler")
    result = measure_and_write(
        lambda log: measure_sampler(workers=args.workers, threads=args.threads, model=args.model, batch=args.batch,
                                    connections=args.connections, duration=args.duration, rounds=args.rounds,
                                    hz=args.sample_hz, log=log),
        format_table, _write_doc, args.out, args.doc)
    return 0 if result["checks"] else 1
