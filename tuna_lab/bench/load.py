"""``tuna-lab bench load``: tuna_lab's load generator side by side with Debian's ``wrk``.

A generator that costs more CPU than a C one takes that CPU from the server
it measures. This bench starts one real tuna_lab server (by default W=2,
T=1, the small model, batch 10, policy ``cfs``), and against it runs, in
rounds whose order rotates, ``wrk`` (with a Lua script that POSTs the same
body), :func:`tuna_lab.measure.loadgen.load.closed_loop` with the same number
of connections, and :func:`tuna_lab.measure.loadgen.load.open_loop` offering
wrk's last measured throughput (Poisson arrivals, at most that many
requests in flight). For each run it records requests/s, p50, p99 and the
generator's CPU per request: wrk's from its rusage as a child process
(user + system), ours from ``frame.attrs["generator"]``. It then checks the
targets on the median over the rounds of each round's ratio
(the runs of a round are adjacent in time, so a load that drifts over
the bench cancels out), for the closed loop and for the open loop:

* CPU per request at most :data:`TARGETS` ``["cpu_ratio"]`` (1.25x) wrk's;
* requests/s at least :data:`TARGETS` ``["rps_min"]`` (95 %) of wrk's;
* the closed loop's p50 within :data:`TARGETS` ``["p50_within"]`` (15 %) of
  wrk's (the open loop's latency counts from the schedule: not comparable);
* and, against a trivial endpoint
  (:func:`tuna_lab.measure.loadgen.load.measure_generator`), an open loop at 1,000
  requests/s with a p99 send lag of at most 1 ms.

These are benchmarks, not tests: PASS/FAIL is printed, the exit status is 0.
Other work on the machine shows in the numbers (the load average is
printed): run it on a quiet machine.

Examples
--------
>>> # skipped: needs a server on port 8000 and Debian's wrk
>>> run_wrk("http://127.0.0.1:8000/predict", b"{}", duration=2.0)["rps"] > 0   # doctest: +SKIP
True
"""

import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time

from .. import _files
from .._checks import positive_int, positive_number
from ..errors import LoadError
from ._measured import header, measure_and_write

__all__ = ["TARGETS", "TOOLS", "ensure_wrk", "run_wrk", "compare_with_wrk", "format_table", "run_load_bench"]

#: The targets (issue 50): the closed and the open loop's CPU per request at
#: most ``cpu_ratio`` times wrk's, at ``rps_min`` or more of wrk's requests/s;
#: the closed loop's p50 within ``p50_within`` (relative) of wrk's; against a
#: trivial endpoint, an open loop at ``open_rate``/s with a p99 send lag of at
#: most ``open_lag_p99`` seconds.
TARGETS = {"cpu_ratio": 1.25, "rps_min": 0.95, "p50_within": 0.15, "open_rate": 1000.0, "open_lag_p99": 0.001}
#: The tools of a round: wrk, our closed loop, our open loop (at wrk's throughput).
TOOLS = ("wrk", "tuna_lab", "tuna_open")

# wrk's Lua script: POST the body read from a file, and print what the bench
# needs as one JSON line when done (latency and duration in microseconds).
_LUA = """\
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open(BODY_PATH, "rb"))
wrk.body = f:read("*a")
f:close()
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "TUNA-WRK {\\"requests\\": %d, \\"duration_us\\": %d, \\"p50_us\\": %d, \\"p99_us\\": %d, "
    .. "\\"errors\\": %d, \\"status_errors\\": %d}\\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, e.status))
end
"""
_MARK = "TUNA-WRK "
# Time wrk gets beyond its own -d before it is killed (start-up, a slow last request).
_WRK_GRACE = 60.0


def ensure_wrk(install=True):
    """The path of ``wrk``, installing Debian's package if it is missing and we may; else None.

    Installs with ``apt-get install -y wrk`` only when ``install`` is true,
    this process runs as root and ``apt-get`` exists.

    Examples
    --------
    >>> # skipped: may install Debian's wrk
    >>> ensure_wrk(install=False)   # doctest: +SKIP
    '/usr/bin/wrk'
    """
    path = shutil.which("wrk")
    if path or not install or os.geteuid() != 0 or not shutil.which("apt-get"):
        return path
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run(["apt-get", "install", "-y", "-q", "wrk"], env=env, capture_output=True, timeout=600,
                       check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return shutil.which("wrk")


def _wrk_version(wrk):
    try:
        p = subprocess.run([wrk, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    line = (p.stdout or p.stderr).strip().splitlines()
    return line[0].split(" Copyright")[0] if line else "unknown"


def run_wrk(url, body, connections=8, duration=5.0, threads=1, wrk="wrk"):
    """One run of ``wrk`` POSTing ``body`` to ``url``; its throughput, latency and CPU.

    Parameters
    ----------
    url : str
        A loopback ``http://`` URL.
    body : bytes
    connections : int
        ``-c``: connections, each with one request in flight.
    duration : float
        ``-d``: seconds (rounded to whole seconds, at least 1).
    threads : int
        ``-t``: wrk's threads (at most ``connections``).
    wrk : str
        The executable.

    Returns
    -------
    dict
        ``tool`` ("wrk"), ``requests``, ``seconds``, ``rps``, ``p50``, ``p99``
        (seconds), ``errors`` (socket errors and non-2xx/3xx answers),
        ``cpu_user``, ``cpu_sys``, ``cpu_per_request`` (seconds: wrk's own
        rusage as a child process, from ``wait4``).

    Examples
    --------
    >>> # skipped: needs a server on port 8000 and Debian's wrk
    >>> r = run_wrk("http://127.0.0.1:8000/predict", b"{}", duration=2.0)   # doctest: +SKIP
    >>> r["cpu_per_request"] < 0.001   # doctest: +SKIP
    True
    """
    from ..measure.loadgen.wire import check_url

    url = check_url(url)
    connections = positive_int("connections", connections, LoadError)
    threads = min(positive_int("threads", threads, LoadError), connections)
    seconds = max(1, round(positive_number("duration", duration, LoadError)))
    with tempfile.TemporaryDirectory(prefix="tuna-wrk-") as tmp:
        body_path, script = os.path.join(tmp, "body"), os.path.join(tmp, "post.lua")
        with open(body_path, "wb") as fh:
            fh.write(bytes(body))
        with open(script, "w") as fh:
            fh.write(_LUA.replace("BODY_PATH", _lua_string(body_path)))
        argv = [wrk, f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", "30s", "-s", script, url]
        with open(os.path.join(tmp, "out"), "w+") as out:
            try:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True)
            except OSError as exc:
                raise LoadError(f"cannot run {wrk}: {exc.strerror or exc}") from None
            # wait4 (not Popen.wait) for the child's own rusage: user + system CPU.
            status, usage = _wait4(proc, seconds + _WRK_GRACE)
            out.seek(0)
            text = out.read()
    lines = [line for line in text.splitlines() if line.startswith(_MARK)]
    if status != 0 or not lines:
        last = text.strip().splitlines()[-1:] or [""]
        raise LoadError(f"wrk failed (exit status {status}): {last[0]}")
    doc = json.loads(lines[-1][len(_MARK):])
    n, secs = doc["requests"], doc["duration_us"] / 1e6
    user, sys_ = usage.ru_utime, usage.ru_stime
    return {"tool": "wrk", "requests": n, "seconds": secs, "rps": n / secs if secs > 0 else math.nan,
            "p50": doc["p50_us"] / 1e6, "p99": doc["p99_us"] / 1e6,
            "errors": doc["errors"] + doc["status_errors"],
            "cpu_user": user, "cpu_sys": sys_, "cpu_per_request": (user + sys_) / n if n else math.nan}


def _wait4(proc, limit):
    """Wait (at most ``limit`` s, then kill) for ``proc``; its exit status and rusage."""
    end = time.monotonic() + limit
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage
        if time.monotonic() > end:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            raise LoadError(f"wrk did not finish within {limit:.0f} s and was killed")
        time.sleep(0.05)


def _lua_string(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _ours(url, body, connections, requests, duration):
    """One closed-loop run of tuna_lab's generator: the same fields as :func:`run_wrk`."""
    from ..measure.loadgen.load import closed_loop, summary

    frame = closed_loop(url, body, requests=requests, concurrency=connections, timeout=30.0,
                        deadline=max(60.0, 4.0 * duration))
    s, cost = summary(frame), frame.attrs["generator"]
    n = cost["requests"]
    return {"tool": "tuna_lab", "requests": s["ok"], "seconds": s["wall_seconds"], "rps": s["throughput"],
            "p50": s["client_p50"], "p99": s["client_p99"], "errors": s["failed"],
            "cpu_user": cost["cpu_user"], "cpu_sys": cost["cpu_sys"],
            "cpu_per_request": cost["cpu_seconds"] / n if n else math.nan}


def _ours_open(url, body, connections, rate, duration):
    """One open-loop run of tuna_lab's generator at ``rate``/s for about ``duration`` s: as :func:`_ours`.

    ``rate`` requests/s with Poisson arrivals, ``round(rate * duration)`` of
    them, at most ``connections`` in flight (as wrk's connections): requests/s
    is the completed ones over the trial's wall time; p50 and p99 count from
    each request's scheduled time (a wait for a free connection included).
    """
    from ..measure.loadgen.load import open_loop, summary

    n = max(10 * connections, round(rate * duration))
    frame = open_loop(url, body, rate, requests=n, timeout=30.0, max_in_flight=connections,
                      deadline=max(60.0, 4.0 * duration))
    s, cost = summary(frame), frame.attrs["generator"]
    sent = cost["requests"]
    return {"tool": "tuna_open", "requests": s["ok"], "seconds": s["wall_seconds"], "rps": s["throughput"],
            "p50": s["client_p50"], "p99": s["client_p99"], "errors": s["failed"],
            "cpu_user": cost["cpu_user"], "cpu_sys": cost["cpu_sys"],
            "cpu_per_request": cost["cpu_seconds"] / sent if sent else math.nan, "offered": float(rate)}


def _machine():
    from ..machine import host

    return {"cpu_model": host.cpu_model(), "cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
            "kernel": f"{platform.system()} {platform.release()}", "python": platform.python_version()}


def compare_with_wrk(workers=2, threads=1, model="small", batch=10, policy="cfs", connections=8, duration=5.0,
                     requests=None, rounds=5, wrk="wrk", open_duration=3.0, log=None):
    """Run ``wrk`` and tuna_lab's closed and open loop against one real server, in rotating rounds.

    Parameters
    ----------
    workers, threads : int
        The server's Gunicorn workers and OpenMP threads per worker.
    model : {"small", "medium", "large"}
    batch : int
        Rows per request (the body, :func:`tuna_lab.measure.loadgen.schedule.payload`).
    policy : str
        The server's placement policy.
    connections : int
        Requests in flight, for both tools.
    duration : float
        Seconds of each wrk run; tuna_lab's closed runs send as many requests
        as the last measured rate gives in that time; its open runs offer
        wrk's last throughput for that time.
    requests : int, optional
        A fixed number of requests for tuna_lab's runs instead.
    rounds : int
        Rounds; each runs :data:`TOOLS`, the order rotating between rounds.
    wrk : str or None
        wrk's executable; None runs tuna_lab's side only.
    open_duration : float
        Seconds of the open loop at :data:`TARGETS` ``["open_rate"]``
        against a trivial endpoint (:func:`tuna_lab.measure.loadgen.load.measure_generator`).
    log : callable, optional
        Called with one line of progress per run.

    Returns
    -------
    dict
        ``rows`` (one dict per run, as :func:`run_wrk`, plus ``round``; the
        open loop's also ``offered``), ``medians`` (per tool), ``ratios``
        (tuna_lab / wrk: the median over the rounds of each round's ratio),
        ``open_ratios`` (the same for the open loop) and ``checks`` (against
        :data:`TARGETS`; only ``open_lag_p99`` without wrk), ``open`` (from ``measure_generator``),
        ``wake_lag`` (the machine's floor for the send lag, from
        :func:`tuna_lab.measure.loadgen.clock.wake_lag`),
        ``config``, ``machine``, ``wrk_version``, ``load_average``
        (before, after).

    Examples
    --------
    >>> # skipped: starts a lab server and runs wrk against it
    >>> result = compare_with_wrk(duration=2.0, rounds=1)   # doctest: +SKIP
    >>> sorted(result["medians"])   # doctest: +SKIP
    ['tuna_lab', 'tuna_open', 'wrk']
    """
    from ..server.launch import Server
    from ..measure.loadgen.load import closed_loop, measure_generator, payload, summary
    from ..measure.loadgen.clock import wake_lag

    rounds = positive_int("rounds", rounds, LoadError)
    connections = positive_int("connections", connections, LoadError)
    duration = positive_number("duration", duration, LoadError)
    if requests is not None:
        requests = positive_int("requests", requests, LoadError)
    log = log or (lambda line: None)
    body = payload(model, batch)
    load_before = os.getloadavg()
    rows = []
    with Server(workers, threads, model=model, policy=policy, die_with_parent=True) as srv:
        url = f"{srv.url}/predict"
        # A warm-up: first requests build caches, and its rate sizes the first run.
        warm = summary(closed_loop(url, body, requests=max(100, 4 * connections), concurrency=connections,
                                   timeout=30.0, deadline=120.0))
        rate = warm["throughput"] if warm["ok"] else 100.0
        offer = rate            # the open loop's rate: wrk's last throughput (before wrk's first run, the warm-up's)
        for k in range(rounds):
            order = TOOLS[k % 3:] + TOOLS[:k % 3]
            for tool in order:
                if tool == "wrk":
                    if wrk is None:
                        continue
                    row = run_wrk(url, body, connections=connections, duration=duration, wrk=wrk)
                    if row["rps"] > 0:
                        offer = row["rps"]
                elif tool == "tuna_open":
                    row = _ours_open(url, body, connections, offer, duration)
                else:
                    n = requests or max(10 * connections, round(rate * duration))
                    row = _ours(url, body, connections, n, duration)
                if row["rps"] > 0 and tool != "tuna_open":
                    rate = row["rps"]
                row["round"] = k + 1
                rows.append(row)
                log(f"round {k + 1} {tool:8s} {row['rps']:8.1f} req/s  p50 {1e3 * row['p50']:7.2f} ms  "
                    f"p99 {1e3 * row['p99']:7.2f} ms  CPU {1e6 * row['cpu_per_request']:6.1f} us/request")
    opened = measure_generator(rate=TARGETS["open_rate"], duration=open_duration, requests_closed=2000,
                               concurrency=connections)
    # The machine's own floor for that send lag: a thread that only wakes on the same kind of schedule.
    floor = wake_lag(rate=TARGETS["open_rate"], duration=open_duration)
    medians = {}
    for tool in TOOLS:
        mine = [r for r in rows if r["tool"] == tool]
        if mine:
            medians[tool] = {key: statistics.median(r[key] for r in mine)
                             for key in ("rps", "p50", "p99", "cpu_per_request", "requests", "errors")}
    ratios, open_ratios, checks = {}, {}, {}
    if "wrk" in medians:
        # Paired: each round's runs are adjacent in time, so their ratio
        # cancels a load that drifts over the bench (other work on the machine);
        # the median of the rounds' ratios is then robust to a round it disturbed.
        by_round = {}
        for r in rows:
            by_round.setdefault(r["round"], {})[r["tool"]] = r

        def paired(tool):
            pairs = [(p[tool], p["wrk"]) for p in by_round.values() if tool in p and "wrk" in p]
            return {key: statistics.median(ours[key] / theirs[key] for ours, theirs in pairs)
                    for key in ("rps", "p50", "p99", "cpu_per_request")}

        ratios, open_ratios = paired("tuna_lab"), paired("tuna_open")
        checks = {"cpu_per_request": ratios["cpu_per_request"] <= TARGETS["cpu_ratio"],
                  "rps": ratios["rps"] >= TARGETS["rps_min"],
                  "p50": abs(ratios["p50"] - 1.0) <= TARGETS["p50_within"],
                  "open_cpu_per_request": open_ratios["cpu_per_request"] <= TARGETS["cpu_ratio"],
                  "open_rps": open_ratios["rps"] >= TARGETS["rps_min"]}
    checks["open_lag_p99"] = opened["send_lag_p99"] <= TARGETS["open_lag_p99"]
    return {"rows": rows, "medians": medians, "ratios": ratios, "open_ratios": open_ratios, "checks": checks,
            "open": opened,
            "wake_lag": floor,
            "config": {"workers": workers, "threads": threads, "model": model, "batch": batch, "policy": policy,
                       "connections": connections, "duration": duration, "requests": requests, "rounds": rounds},
            "machine": _machine(), "wrk_version": _wrk_version(wrk) if wrk else None,
            "engine": _engine(), "load_average": [load_before, os.getloadavg()]}


def _engine():
    """The loop tuna_lab's trials ran on (wire.drive's default), and why when it is not the C one."""
    from ..measure.loadgen.native import choose

    name, why = choose()
    return {"engine": name, "engine_why": why}


def _verdict(ok):
    return "PASS" if ok else "FAIL"


def format_table(result):
    """The bench's result as lines of text: every run, the medians, the ratios and the verdicts.

    Examples
    --------
    >>> # skipped: starts a lab server and runs wrk against it
    >>> lines = format_table(compare_with_wrk(duration=2.0, rounds=1))   # doctest: +SKIP
    >>> lines[0].split()[:3]   # doctest: +SKIP
    ['tool', 'round', 'requests/s']
    """
    head = f"{'tool':9s} {'round':>5s} {'requests/s':>10s} {'p50 ms':>8s} {'p99 ms':>8s} {'CPU us/req':>10s} " \
           f"{'requests':>8s} {'errors':>6s}"
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        lines.append(f"{r['tool']:9s} {r['round']:5d} {r['rps']:10.1f} {1e3 * r['p50']:8.2f} {1e3 * r['p99']:8.2f} "
                     f"{1e6 * r['cpu_per_request']:10.1f} {r['requests']:8d} {r['errors']:6d}")
    lines.append("-" * len(head))
    for tool, m in result["medians"].items():
        lines.append(f"{tool:9s} {'med':>5s} {m['rps']:10.1f} {1e3 * m['p50']:8.2f} {1e3 * m['p99']:8.2f} "
                     f"{1e6 * m['cpu_per_request']:10.1f} {m['requests']:8.0f} {m['errors']:6.0f}")
    ratios, checks = result["ratios"], result["checks"]
    if ratios:
        opens = result["open_ratios"]
        lines += ["", "tuna_lab (closed loop) / wrk (median of the rounds' ratios):",
                  f"  CPU per request  {ratios['cpu_per_request']:6.2f}x   target <= {TARGETS['cpu_ratio']:.2f}x"
                  f"       {_verdict(checks['cpu_per_request'])}",
                  f"  requests/s       {ratios['rps']:6.2f}x   target >= {TARGETS['rps_min']:.2f}x"
                  f"       {_verdict(checks['rps'])}",
                  f"  p50              {ratios['p50']:6.2f}x   target within {100 * TARGETS['p50_within']:.0f} %"
                  f"     {_verdict(checks['p50'])}",
                  f"  p99              {ratios['p99']:6.2f}x   (no target)",
                  "tuna_open (open loop at wrk's last throughput) / wrk:",
                  f"  CPU per request  {opens['cpu_per_request']:6.2f}x   target <= {TARGETS['cpu_ratio']:.2f}x"
                  f"       {_verdict(checks['open_cpu_per_request'])}",
                  f"  requests/s       {opens['rps']:6.2f}x   target >= {TARGETS['rps_min']:.2f}x"
                  f"       {_verdict(checks['open_rps'])}"]
    else:
        lines += ["", "no wrk: tuna_lab's side only, no ratios"]
    engine = result.get("engine") or {"engine": "?", "engine_why": ""}
    lines += ["", f"tuna_lab's loop: {engine['engine']}" + (f" ({engine['engine_why']})" if engine["engine_why"] else "")]
    o = result["open"]
    lines += ["", f"open loop, {o['rate']:.0f} requests/s for {o['duration']:.1f} s against a trivial endpoint "
                  f"(another process): {o['open_requests']} requests, {o['open_failed']} failed, "
                  f"CPU {1e6 * o['open_cpu_per_request']:.1f} us/request",
              f"  send lag p50 {1e3 * o['send_lag_p50']:.3f} ms, p99 {1e3 * o['send_lag_p99']:.3f} ms "
              f"(target <= {1e3 * TARGETS['open_lag_p99']:.0f} ms), max {1e3 * o['send_lag_max']:.3f} ms"
              f"   {_verdict(checks['open_lag_p99'])}",
              f"  the machine's floor (a thread that only wakes on that schedule, no requests): "
              f"p50 {1e3 * result['wake_lag']['lag_p50']:.3f} ms, p99 {1e3 * result['wake_lag']['lag_p99']:.3f} ms, "
              f"max {1e3 * result['wake_lag']['lag_max']:.3f} ms",
              *(["  the floor is over the target too: here a thread's wake-up, not the generator, sets the p99"]
                if not checks["open_lag_p99"] and result["wake_lag"]["lag_p99"] > TARGETS["open_lag_p99"] else []),
              f"closed loop against it: {o['closed_rps']:.0f} requests/s, "
              f"CPU {1e6 * o['closed_cpu_per_request']:.1f} us/request (keep-alive)"]
    return lines


# Where the generator's microseconds went (issue 50), profiled before it was changed: static text, not
# measured by this bench; the figures and commands are those of that profile.
_PROFILE = """
## Where the microseconds went (issue 50's profile, 2026-11-28)

Profiled against the same lab server (W=2, T=1, small model, batch 10, 8 connections), on the 2-CPU machine
while other work ran on it (load average 4-12), before anything was changed:

- **System calls.** `strace -c`: the generator makes about 7.6 calls a request (socket, connect, sendto,
  epoll_ctl, 1.3 epoll_wait, 1.3 recvfrom, close); wrk makes about 17 (it also calls fcntl twice,
  setsockopt, and epoll_ctl six times). Its system time per request is no higher than wrk's (70-110 us
  against wrk's 80-100 us): the gap was all user time, 115-180 us against wrk's 35-40 us.
- **User time: the interpreter, per wake.** cProfile of `drive` over 4,000 requests: 75 Python-level calls a
  request, 6,271 reads and parses for 4,000 responses (the lab server's Gunicorn writes the headers and the
  body in two sends; a read of the headers alone was parsed in full, then parsed again with the body), a
  timeout scan every turn of the loop. `valgrind --tool=callgrind` (user-space instructions of a 500-request
  run minus a 100-request run, PYTHONHASHSEED=0): 88.5k instructions a request, of which bytes `in`
  (`b"close" in connection`) cost about 7k: `bytes.__contains__` first tries its argument as an integer and
  formats a TypeError it then drops; argument parsing of the socket calls about 3.7k; the end of a trial's
  copy into numpy object arrays, an element at a time, 2k.
- **Contention multiplies it.** Against a trivial endpoint at 10,000 requests/s the same code costs 22 us
  of user time a request, against the lab server at 150-250 requests/s 100-180 us: at a low rate every
  response is a wake of its own into cold caches (wrk's user time grows the same way, 3.5 to 35 us).
  Fewer instructions and fewer wakes a request is what pays.

What changed (`tuna_lab.measure.loadgen.wire`): a response whose body is still arriving keeps its parsed
header fields and the next read only slices the body; the usual paths (connect and send, the read and parse,
the close) are inline, 49 calls a request instead of 75; the timeout scan runs only when the oldest timeout
is due; `find` instead of `in`; one slice copy of the bodies at the end; and against a server that closes
every connection after its answer, new connections get `SO_RCVLOWAT` one byte past the shortest header
block seen, so epoll no longer wakes the loop for the header write alone (1.09 reads a request, was 1.57).
callgrind: 69.1k instructions a request (-22 %). The same A/B of the old and new engine in one process
against one server (6 alternating trials of 1,500 requests each) was inside the machine's noise on some
runs: the rows above, measured here side by side with wrk, are the figures that count.

## The second pass (issue 50, 2026-11-29)

Profiled again against the same lab server before this pass's changes, the machine shared with other work
(load average 5-13):

- **Kernel against interpreter.** `perf record -e cpu-clock -g` of the generator thread alone (closed loop,
  1,500 requests): 48 % of its samples in the kernel (connect 15 %, close 14 %, epoll_wait 6 %, socket 4 %,
  sendto 4 %, recvfrom 2 %), 43 % in libpython, 6 % in libc (malloc, the GIL's mutex), 3 % in the socket
  and select modules. The kernel's share is what wrk pays too (wrk makes more system calls a request, and
  waits once more, for the connect); the gap is the interpreter's.
- **Where the interpreter goes.** `py-spy record` (line samples): `parse_buffer` was 39 % of the
  generator's Python time, the loop 17 %, the read 14 %, connect 12 %, the response's row 10 %. Counted
  with `sys.settrace` opcodes: 710 bytecodes a request, 253 of them in `parse_buffer`. callgrind (user-space
  instructions a request, a 1,200-request run minus a 200-request one, against the trivial endpoint
  closing every connection, eight connections): 59.0k, of which `bytes.find` 10-11k (ten searches a response; each is a
  METH_VARARGS call whose argument parsing costs more than the search), `bytes()` copies of slices that were
  bytes already 1.9k (`bytes.__bytes__` is looked up and called), the end-of-trial list-to-array copies
  2.8k (numpy inspects every item as a possible sequence), the GIL's release and retake around the eight
  system calls 3.3k, socket argument parsing 3-4k.

What changed (`tuna_lab.measure.loadgen.wire` and `.response`): the send (`_start`) and the response's row
(`_answered`) are inline in the loop and the read; closed connections' `_Conn` objects are reused (a new
connection per request against Gunicorn's sync workers); timeouts are read from the send times (requests go
out in index order with one timeout, so the oldest in flight is the next due: no queue of tuples); the
status line is read in place (no search for its end), a bytes buffer is sliced without a `bytes()` copy,
and `Connection: close` as Gunicorn writes it is recognised with one `startswith`; the end-of-trial copies
go through `np.fromiter`. callgrind with one connection (so that no two responses share a wake, which makes
the count repeatable; with eight it moves with how responses batch): 50.4k instructions a request, was 58.7k
(-14 %); 628 bytecodes a request (was 710), 242 of them to parse a response like Gunicorn's (was 277).
After the runs below, the cyclic garbage collector is paused while a trial runs (as `timeit` does): a full
collection walks every object of the process, and in a large one it held the GIL for tens of ms in the
middle of a trial (a 12-request burst in the tests), charged to the generator's thread. The bench rows
below were measured before that change.

CPU per request of the generator thread, the old and new engine in one process against one lab server,
alternating trials (a throwaway script that loads the old `wire.py` beside the new one):

```text
load  trials               closed loop new/old          open loop (120/s) new/old
9-12  6 x 600 requests     0.86 (126.9 -> 109.7 us)     0.91 (287.8 -> 260.9 us), 4 x 500
2-4   10 x 1,500 requests  0.94 (121.2 -> 114.3 us)     -
```

Eight of those ten pairs were below 1 (0.90-1.05): a saving of 5-14 %, larger when the machine is busy.

`make bench`'s load part (`tuna-lab bench load --doc docs/load-bench.md`), ratios to wrk in the same run,
with the load average (1 min) before each run. Runs 1-4 are of the first commit of this pass (all of it but
the `Connection: close` shortcut), 5-7 of the last (the table at the top of this page was run 7 then):

```text
run  load  closed CPU  closed req/s  open CPU  open req/s
1    12.2    1.30x        0.82x        1.81x      0.88x
2     8.0    1.33x        1.27x        1.69x      0.87x
3     7.4    1.24x        1.10x        1.60x      0.94x
4     2.4    1.42x        1.11x        1.69x      0.81x
5     3.8    1.28x        1.03x        1.55x      0.90x
6     3.2    1.36x        1.05x        1.38x      0.96x
7     3.9    1.31x        0.99x        1.45x      0.93x
median of 5-7: closed 1.31x at 1.03x its requests/s, open 1.45x at 0.93x
before this pass (2026-11-28, one run, load 6.5): closed 1.30x at 1.00x, open 1.76x at 0.92x
```

The bench's ratios move more between runs (1.24x to 1.42x for the same code) than this pass's saving, so
the runs before and after do not show it; the paired A/B does. **The target (at most 1.25x wrk's CPU a
request, both loops) is not met:** the closed loop is at about 1.3x and the open loop at about 1.5x.
What is left, and why:

- **The interpreter per request.** About 50k user-space instructions and 630 bytecodes a request remain,
  and at a lab server's rate every response is a wake of its own into caches the server's model has just
  used, which multiplies their cost (the first profile: 22 us of user time a request at 10,000 requests/s
  against a trivial endpoint, 100 us and more against the lab server, where wrk's was 35-40 us). The
  searches of the header block (`Content-Length`, `Transfer-Encoding`, `Connection`, `Server-Timing`) are
  each a C call dearer than its search; a regular expression doing all of them in one call was 5x slower
  here. Closing the gap needs the loop in C (an extension module, which the project does not build) or a
  C client the project can call.
- **The open loop's second wake.** Against a server that is not saturated, every open-loop request is two
  wakes (the timerfd at its send time, then its response) and a `timerfd_settime` through ctypes, where the
  closed loop sends on the response's wake: why the open loop costs more than the closed one (1.4-1.8x
  wrk's against 1.2-1.4x). epoll's own timeout is whole milliseconds (Python 3.11 has no `os.timerfd_*`
  and `epoll_pwait2` is not exposed), so the timer stays.
- **The open loop's requests/s** (0.81-0.96x) is its schedule, not its cost: Poisson arrivals at wrk's last
  throughput, with at most as many in flight as wrk's connections, queue behind a saturated server, and the
  trial's wall time includes that queue's drain.
- Considered and left out: `SO_LINGER` 0 (a reset instead of a FIN on close) would spare the server's
  TIME_WAIT processing, which loopback charges to the generator, but it is not what wrk or a browser does and
  can reset a worker that has not closed yet.

## The third pass: the loop in C (issue 50, 2026-11-29)

What the profiles above left, the interpreter, is gone from the per-request path: the send/receive loop is a C
extension, `_engine` in `tuna_lab/measure/loadgen/` (`_engine.c`, `_engine_conn.c`, `_engine_http.c`), compiled by
`pip install` (`setup.py`'s one optional extension: `make setup`, a fresh clone's `pip install -e .`, Binder's
`pip install .[lab]`). `wire.drive` runs it for every trial when it is built, and the Python loop otherwise
(`drive(engine="python")` asks for it); which ran, and why when it was not the C one, is kept on the trial's
recorder (`rec.engine`), and the header of this page says which one the rows above ran on. It is the same loop
as the Python one, system call for system call: non-blocking sockets on one epoll, the request bytes sent as
built (a partial send finishes on `EPOLLOUT`), a `timerfd` at each open-loop send time, `SO_RCVLOWAT` against
a closing server, one resend on a new connection when a kept-alive one turns out closed, times from
`CLOCK_MONOTONIC` (`time.monotonic`'s clock). The usual response (a status line, `Content-Length` or the
connection's close, `Connection`, one `Server-Timing`) is framed in C; a rare one (an interim 1xx,
`Transfer-Encoding`, several `Server-Timing` headers, a malformed status line or length, a close before the
end) is handed with the bytes received so far to the Python parser (`response.parse_buffer`), so both loops
give it the same row and the same error text. Each connection's buffer starts at 16 kB, doubles as a
response needs (up to 1 GiB, past which the request fails), and every read and write is bounds-checked;
`tests/test_engine.py` holds the two loops to the same rows for every framing and failure, and the C
framing to the parser at every cut of every test response and on random bytes; those tests and
`tests/test_load.py` also pass with the extension compiled with AddressSanitizer and UBSan.

CPU per request of the generator thread, the C and the Python loop alternating in one process against one
lab server (W=2, T=1, small model, batch 10; 4 pairs; closed: 1,200 requests, 8 connections; open: 750
requests at 250/s, at most 8 in flight), load average 4.9-5.3:

```text
loop    closed loop            open loop
C        92 us (85-132)        109 us (106-116)
Python  198 us (164-205)       194 us (165-224)
C/Python  0.51x                  0.58x
```

`make bench`'s load part (`tuna-lab bench load`, run three times one after the other; the table at the top
is run 3), ratios to wrk in the same run, with the load average (1 min) when its server started:

```text
run  load  closed CPU  closed req/s  open CPU  open req/s
1    5.2     0.81x        1.05x        1.18x      0.90x
2    5.0     0.92x        0.80x        0.85x      0.85x
3    5.7     0.89x        0.61x        1.07x      0.63x
median       0.89x        0.80x        1.07x      0.85x
before (the Python loop, median of three runs, load 3-4): closed 1.31x at 1.03x, open 1.45x at 0.93x
```

**CPU per request: the target is met** in every run, both loops: the closed loop now costs less than wrk
(0.81-0.92x), the open loop 0.85-1.18x (its second wake a request, the timer's, is still there).
**Requests/s: not shown at this load.** The machine was shared with other work (load average 3.7-5.7 on 2
CPUs over the runs): within run 3 the same server's throughput moved between 114 and 476 requests/s,
wrk's own between 151 and 476, so a round's ratio is mostly which tool drew the busier seconds (run 3's
closed loop: 0.61x, 0.46x, 1.73x, 1.35x, 0.59x by round). The generator's side of it is its CPU, which went down by half;
a quiet machine is what the requests/s check needs. The open loop's requests/s is also its schedule (see
above): it offers wrk's previous throughput, so it trails whenever that run drew quieter seconds.
The trivial endpoint's open loop at 1,000/s missed its 1 ms p99 send lag in all three runs (2.4-2.5 ms,
the floor 2.3-2.4 ms in runs 1 and 3, 0.34 ms in run 2); the two loops alternating at that rate, load 4.3:
p99 3.8-4.0 ms for the C loop, 4.0-6.0 ms for the Python one (CPU 32-41 against 71-87 us a request), so the
machine's wake-ups, not the C loop, set it.
"""


def _engine_words(engine):
    if not engine:
        return "not recorded"
    if engine["engine"] == "c":
        return "C (`_engine` in `tuna_lab/measure/loadgen/`, built by `pip install`)"
    return f"Python ({engine['engine_why']})"


def _write_doc(path, result, lines):
    m, c = result["machine"], result["config"]
    before, after = result["load_average"]
    text = (
        "# Load generator benchmark\n\n"
        "tuna_lab's load generator, closed loop (`tuna_lab.measure.loadgen.load.closed_loop`, tool `tuna_lab`) "
        "and open loop (`open_loop` offering wrk's last throughput with at most as many requests in flight as "
        "wrk's connections, tool `tuna_open`), and Debian's `wrk`, side by side against the same running "
        "tuna_lab server with the same body, in rounds whose order rotates. Produced by `make bench` "
        f"(`tuna-lab bench load`) on {time.strftime('%Y-%m-%d')}.\n\n"
        f"- machine: {m['cpu_model']}, {m['cpus']} CPUs ({m['usable_cpus']} usable), {m['kernel']}, "
        f"Python {m['python']}\n"
        f"- wrk: {result['wrk_version'] or 'not installed'}\n"
        f"- tuna_lab's loop: {_engine_words(result.get('engine'))}\n"
        f"- server: W={c['workers']}, T={c['threads']}, model {c['model']}, batch {c['batch']}, policy "
        f"{c['policy']}; {c['connections']} connections; {c['rounds']} rounds of {c['duration']:g} s\n"
        f"- load average before / after: {' '.join(f'{x:.2f}' for x in before)} / "
        f"{' '.join(f'{x:.2f}' for x in after)}\n\n"
        "CPU per request is each generator's own CPU time (user + system) divided by its requests: wrk's "
        "rusage as a child process, and for tuna_lab `frame.attrs[\"generator\"]` (the generator thread's "
        "`RUSAGE_THREAD`). Latency is from send to full response (the open loop's: from the scheduled send). "
        "The targets: CPU per request at most 1.25x wrk's at 95 % or more of its requests/s, "
        "for both loops. The generator and the server share "
        "the machine's CPUs, so every microsecond the generator spends is taken from the server.\n\n"
        "```text\n" + "\n".join(lines) + "\n```\n\n"
        "## How the generator keeps its cost down\n\n"
        "`tuna_lab.measure.loadgen.wire` sends every trial from one thread of its own (pinned with `cpus=` / "
        "`--client-cpus`, gone when the trial ends), on one `epoll`, with no event-loop framework, in C "
        "(`_engine`, compiled by `pip install`; the Python loop where it could not be, as the header above "
        "and the trial's `rec.engine` say): the request "
        "is built once and sent with one `send` (a new connection per request against Gunicorn's sync "
        "workers, which close after each answer, as wrk's connections see too; kept alive where the server "
        "allows), responses are read into one buffer and parsed only as far as `Content-Length` or chunked "
        "framing needs, and bodies are decoded after the trial. Open-loop send times come from a `timerfd` "
        "armed at each scheduled time (epoll's own timeout is whole milliseconds). Every request still gets "
        "its row: scheduled send time, actual send time, latency from the scheduled time in open loop.\n\n"
        "The open-loop line's *floor* is a thread that only wakes on the same schedule and sends nothing: "
        "when it is high, the machine's scheduler (other runnable threads on the same CPUs), not the "
        "generator, sets the send lag.\n" + _PROFILE)
    _files.write_atomic(path, text, parents=True)           # never through a link, whole or not at all


def run_load_bench(args):
    """``tuna-lab bench load``: run :func:`compare_with_wrk` from parsed arguments; print, write CSV and doc.

    Examples
    --------
    >>> from tuna_lab.cli import main
    >>> # skipped: starts a lab server and runs wrk against it
    >>> main(["bench", "load", "--duration", "2", "--rounds", "1"])   # doctest: +SKIP
    0
    """
    # Bad input fails before anything is installed, started or printed.
    for name in ("workers", "threads", "batch", "connections", "rounds"):
        positive_int(name, getattr(args, name), LoadError)
    for name in ("duration", "open_duration"):
        positive_number(name.replace("_", "-"), getattr(args, name), LoadError)
    if args.requests is not None:
        positive_int("requests", args.requests, LoadError)
    wrk = ensure_wrk(install=not getattr(args, "no_install", False))
    if wrk is None:
        print("wrk is not installed and could not be installed (apt-get install wrk, as root): "
              "running tuna_lab's side only", flush=True)
    header("load")
    measure_and_write(
        lambda log: compare_with_wrk(workers=args.workers, threads=args.threads, model=args.model, batch=args.batch,
                                     policy=args.policy, connections=args.connections, duration=args.duration,
                                     requests=args.requests, rounds=args.rounds, wrk=wrk,
                                     open_duration=args.open_duration, log=log),
        format_table, _write_doc, args.out, args.doc)
    return 0
