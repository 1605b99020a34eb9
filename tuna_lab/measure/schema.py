"""What a measurement means on disk and in a summary: one definition each.

A *cell* (one application ``{W, T, model, batch}`` measured under several
policies) is a folder named by :func:`cell_key` holding:

``manifest.json`` (:data:`MANIFEST`)
    Machine, kernel, topology, library versions, git commit, seeds, command
    line and the policy order of every trial; ``client_cpus``, the CPUs kept
    for the load generator (``cpus``, ``cpulist``, ``server_cpus``, ``how``:
    given, default or none, and the ``note`` printed), and ``generator``, its
    cost over the cell's trials (``cpu_user``, ``cpu_sys``, ``cpu_seconds``,
    ``requests``, ``cpu_per_request``); ``time``, where the cell's wall time
    went (``total_seconds``; ``measuring_seconds``, the loads alone; and the
    sums of the :data:`PHASE_COLUMNS`); ``placements``, per ``tuna-*``
    policy its mapping's ``status`` and ``proven_optimal``, and where the
    families admit no mapping (``status`` ``"relaxed"``) what the relaxed
    mapping exceeds (``relaxed``: family, amount, message) and why
    (``reason``); ``plans``, per pinning policy the one plan every trial of
    the cell ran (``plan``, as ``tuna-lab plan --format json`` writes it) and
    its ``sha256``; ``migrations_note``, why the kernel does not count
    migrations (null where it does: see :data:`EVIDENCE_COLUMNS`). Written last: a folder without it is an unfinished cell,
    which a sweep redoes.

    Validity, per policy: ``policies`` and ``trials`` are what the cell
    promised (``trials`` valid trials of every policy); ``valid_by_policy``
    counts the valid trials each policy has (``{policy: n}``, every promised
    policy present) and ``valid_trials`` their sum. A trial is valid when its
    ``trial_status`` is ``"ok"`` (which a trial during which a worker was
    replaced or the master died never is: see :data:`FAULT_COLUMNS`), it has
    a p99, and every worker did a fair part of its load
    (:data:`BALANCE_COLUMNS`): one definition,
    :func:`tuna_lab.measure.store.valid_rows`. A cell is
    finished only when every promised policy has its ``trials`` valid trials
    (:func:`tuna_lab.measure.store.cell_state`); a resume of an unfinished
    cell keeps its valid trials and redoes only the missing (trial, policy)
    runs, each in its place in the seeded order. ``attempts`` counts the
    runs of the cell so far (1, then one more per resume), and
    ``kept_runs`` how many (trial, policy) runs this attempt kept from the
    ones before. A manifest that cannot be read, or whose counts are not
    counts, makes the cell not finished (a resume redoes it whole) and is
    refused by every reader with one line.
``requests.parquet`` (:data:`REQUESTS`)
    One row per request (:data:`REQUEST_COLUMNS`, plus the cell and trial
    columns the runner adds).
``trials.parquet`` (:data:`TRIALS`)
    One row per (trial, policy): counts, the latency :func:`percentiles`, the
    server's CPU columns :data:`CPU_COLUMNS`, the scheduler's evidence
    :data:`EVIDENCE_COLUMNS` and the load generator's own
    :data:`GENERATOR_COLUMNS`; ``wall_seconds``, the measured load alone, and
    apart from it the start-up, warm-up and stop :data:`PHASE_COLUMNS`; ``relaxed``, what a relaxed Tuna mapping
    exceeds (empty for the others); the :data:`FAULT_COLUMNS` and
    :data:`BALANCE_COLUMNS`; ``attempt``,
    which run of the cell measured it (0 the first; a resume's trials are
    measured later than the ones it kept).
``threads.parquet`` (:data:`THREADS`)
    Per-thread CPU accounting, one row per (trial, policy, process, role):
    ``role`` is ``"master"``, ``"front"`` or ``"helper"`` for the processes
    that are not workers, and ``"main"``, ``"pool"`` (the runtime's pool
    threads, by the classification ``tuna-lab pin`` uses) or ``"other"`` for
    a worker's threads (:data:`tuna_lab.measure.cpu.ROLES`; results written
    before these roles say ``"openmp"`` for every non-main worker thread, read
    as ``"pool"``); with the :data:`THREAD_EVIDENCE_COLUMNS`. Absent when no
    trial could be accounted.
``requests.csv``, ``trials.csv``
    The same tables as CSV, on request.

While a cell runs, each finished (trial, policy) run is written, fsynced, to
``<cell>`` + :data:`PARTIAL_SUFFIX` (a cell folder of its own whose manifest
says ``partial``, and ``interrupted`` after Ctrl-C), which neither a reader
nor a resume takes for a finished cell; it is removed once the cell is written.

The latency percentiles every summary reports are computed here, one way
(linear interpolation, numpy's and pandas' default), whether over one trial's
requests (:func:`percentiles`) or per group by the analysis (which takes
:data:`PERCENTILES`).

This module imports nothing heavier than numpy.

Examples
--------
>>> percentiles([0.1, 0.2, 0.3], prefix="server")["server_p50"]
0.2
>>> cell_key(2, 2, "medium", 100, "passive")
'w2-t2-medium-b100-passive'
"""

import math

import numpy as np

from ..server.models import STAGES

__all__ = ["PERCENTILES", "percentiles", "cell_key", "MANIFEST", "REQUESTS", "TRIALS", "THREADS",
           "CSV_TABLES", "PARTIAL_SUFFIX", "REQUEST_COLUMNS", "REQUEST_SCHED_COLUMNS", "LATE_REQUEST_COLUMNS",
           "CPU_COLUMNS",
           "GENERATOR_COLUMNS", "PHASE_COLUMNS", "FAULT_COLUMNS", "BALANCE_COLUMNS", "EVIDENCE_COLUMNS",
           "THREAD_EVIDENCE_COLUMNS", "fair_share"]

# -- files of a cell ---------------------------------------------------------------------

#: Everything needed to interpret (or repeat) a cell, as JSON; its presence marks a finished cell.
MANIFEST = "manifest.json"
#: The per-request table of a cell.
REQUESTS = "requests.parquet"
#: The per-(trial, policy) table of a cell.
TRIALS = "trials.parquet"
#: The per-thread CPU table of a cell (only when some trial was accounted).
THREADS = "threads.parquet"
#: CSV copies written on request: ``{table: file name}``.
CSV_TABLES = {"requests": "requests.csv", "trials": "trials.csv"}
#: Suffix of the folder that keeps the finished trials of an interrupted cell.
PARTIAL_SUFFIX = ".partial"


def cell_key(workers, threads, model, batch, wait_policy="default", spincount=None):
    """The name of a cell's folder, e.g. ``w2-t2-medium-b100-passive``.

    The library's default wait adds nothing, so cells measured before wait
    policies were a factor keep their names (and a sweep resumes); a
    ``spincount`` of ``None`` or -1 (the runner's "unset") adds nothing either.

    Parameters
    ----------
    workers, threads, batch : int
    model : str
    wait_policy : str
        ``OMP_WAIT_POLICY`` of the cell (see :mod:`tuna_lab.server.openmp`).
    spincount : int, optional
        ``GOMP_SPINCOUNT`` of the cell.

    Returns
    -------
    str

    Examples
    --------
    >>> cell_key(4, 2, "small", 10)
    'w4-t2-small-b10'
    >>> cell_key(4, 2, "small", 10, spincount=-1), cell_key(4, 2, "small", 10, "active", 0)
    ('w4-t2-small-b10', 'w4-t2-small-b10-active-spin0')
    >>> cell_key(2, 2, "onnx_app", 0)
    'w2-t2-onnx_app'
    """
    # A user's own requests have no batch (0): the name leaves it out.
    key = f"w{workers}-t{threads}-{model}" + (f"-b{batch}" if batch else "")
    if wait_policy != "default":
        key += f"-{wait_policy}"
    if spincount is not None and spincount >= 0:
        key += f"-spin{int(spincount)}"
    return key


# -- columns -----------------------------------------------------------------------------

#: Columns of a load trial's frame, one row per request (times in seconds):
#:
#: * ``request`` - index of the request in the trial;
#: * ``status`` - HTTP status, -1 for a client-side failure (timeout, refused, cut by the deadline);
#: * ``error`` - one line of text, ``""`` for a good response;
#: * ``client_seconds`` - from the scheduled send time to the full response;
#: * ``server_seconds`` - the worker's own time for the request;
#: * one column per stage of :data:`tuna_lab.server.models.STAGES` - each stage's time;
#: * ``pid`` - the worker that served it, -1 when unknown;
#: * ``sent_at`` / ``scheduled_at`` - actual and planned send time since the trial's start;
#: * ``send_lag`` - ``sent_at - scheduled_at``, how late the generator sent it;
#: * ``server_start`` - when the worker began it, on the machine-wide ``CLOCK_MONOTONIC``;
#: * ``cpu_main`` / ``cpu_openmp`` - CPU seconds the worker's main thread / OpenMP pool spent on it;
#:
#: the scheduler's evidence of each request, as the server sends it in its ``Server-Timing`` header
#: (the lab server does, :data:`tuna_lab.server.app.SCHED_METRICS`; NaN where a server does not), over the
#: serving threads - the thread that called the app and the rest of its worker (its OpenMP team) - between
#: the request's start and end in the worker (docs/anatomy.md):
#:
#: * ``rq_wait`` - seconds they waited on a run queue, runnable but not running (schedstat), summed;
#: * ``rq_wait_main`` - the same of the calling thread alone;
#: * ``switches_voluntary`` / ``switches_involuntary`` - their switches (slept or blocked / preempted);
#: * ``request_migrations`` - their moves to another CPU (NaN where the kernel hides ``se.nr_migrations``);
#: * ``last_cpu`` - the CPU the calling thread ran on last (NaN unknown);
#: * ``backlog_seconds`` - from the client's send to the worker's start of the request, both on
#:   ``CLOCK_MONOTONIC`` (the generator only loads this machine): the accept backlog, the transfer and the
#:   worker's read of the request (NaN without ``server_start``).
REQUEST_COLUMNS = ("request", "status", "error", "client_seconds", "server_seconds", *STAGES,
                   "pid", "sent_at", "scheduled_at", "send_lag", "server_start", "cpu_main", "cpu_openmp",
                   "rq_wait", "rq_wait_main", "switches_voluntary", "switches_involuntary", "request_migrations",
                   "last_cpu", "backlog_seconds")

#: The per-request scheduler columns (issue 50), in :data:`REQUEST_COLUMNS`' order.
REQUEST_SCHED_COLUMNS = ("rq_wait", "rq_wait_main", "switches_voluntary", "switches_involuntary",
                         "request_migrations", "last_cpu", "backlog_seconds")

#: Request columns added after the first releases: a frame written before them is still a load frame.
LATE_REQUEST_COLUMNS = ("server_start", "cpu_main", "cpu_openmp") + REQUEST_SCHED_COLUMNS

#: CPU columns of a trial row (NaN when the trial could not be accounted):
#:
#: * ``cpu_seconds`` / ``cpu_per_request`` - CPU time of every worker thread (main, pool and other), in
#:   total and per ok request; the master's, front ends' and helpers' is ``front_cpu_seconds``
#:   (:data:`EVIDENCE_COLUMNS`), so the whole server's is the sum of the two;
#: * ``cpu_main_seconds`` / ``cpu_main_per_request`` - the same for the workers' main threads;
#: * ``idle_cpu_share_main`` - share of the main threads' CPU time spent with no request in flight;
#: * ``cpu_openmp_seconds`` / ``cpu_openmp_per_request`` / ``idle_cpu_share_openmp`` - the same for
#:   the workers' pool threads (role ``"pool"``; spinning between requests shows as idle CPU). Before
#:   the pool was told from a worker's other threads, these counted every non-main thread;
#: * ``load_seconds`` - wall time over which the CPU was sampled;
#: * ``numa_locality`` - mean share of each worker's resident pages on its main thread's NUMA node.
CPU_COLUMNS = ("cpu_seconds", "cpu_per_request", "cpu_main_seconds", "cpu_main_per_request",
               "idle_cpu_share_main", "cpu_openmp_seconds", "cpu_openmp_per_request", "idle_cpu_share_openmp",
               "load_seconds", "numa_locality")

#: The load generator's own cost in a trial row (the measured load, not the warm-up). Results
#: written before these columns existed load with them missing (NaN once tables are combined):
#:
#: * ``generator_cpu_user`` / ``generator_cpu_sys`` / ``generator_cpu_seconds`` - CPU seconds the
#:   generator's processes spent in user space, in the kernel, and both (its own CPU only, not the server's);
#: * ``generator_cpu_per_request`` - ``generator_cpu_seconds`` per request sent, to set beside the
#:   server's ``cpu_per_request``;
#: * ``generator_cpus`` - the CPUs it ran on, as a cpulist (``"1"``, ``"6-7"``; the reserved client
#:   CPUs, or every CPU this process may use when none were reserved);
#: * ``generator_processes`` - how many processes sent the load;
#: * ``generator_wall_seconds`` - wall time of the load, so ``generator_cpu_seconds /
#:   generator_wall_seconds`` is the share of a CPU it kept busy;
#: * ``server_cpus`` - beside ``generator_cpus``: the CPUs the server's threads (master, front ends,
#:   helpers and workers) were allowed on over the load, read from /proc (the *serving CPUs* of
#:   :data:`EVIDENCE_COLUMNS`); disjoint from
#:   ``generator_cpus`` when client CPUs were reserved. ``threads.parquet`` has the same per
#:   (worker, role) in its ``cpus`` column.
#:
#: Beside them, the text column ``generator_engine`` names the loop that sent the load: ``"c"`` (the C
#: loop, :mod:`tuna_lab.measure.loadgen.native`), or ``"python: "`` and why the C loop did not run.
GENERATOR_COLUMNS = ("generator_cpu_user", "generator_cpu_sys", "generator_cpu_seconds",
                     "generator_cpu_per_request", "generator_cpus", "generator_processes", "generator_wall_seconds",
                     "server_cpus")

#: Where a trial's time went besides the load, in its row (NaN for a phase it did not reach). The
#: row's ``wall_seconds`` is the measured load alone, the time its ``throughput`` is over:
#:
#: * ``startup_seconds`` - starting the server under the policy until it answered (the lab server and a
#:   user's app; for a running server, pinning it);
#: * ``warmup_seconds`` - the warm-up requests and the placement, applied and read back;
#: * ``stop_seconds`` - stopping the server (or giving a running server back its masks).
PHASE_COLUMNS = ("startup_seconds", "warmup_seconds", "stop_seconds")

#: Faults of the server during a trial, in its row (0 in rows of tables written before them). From the
#: warm-up to the end of the load - a replacement worker's start-up and warm-up would fall inside the
#: trial, and its requests would be served by a cold worker:
#:
#: * ``workers_replaced`` - workers the server had when the warm-up began that were gone when the load
#:   ended, or new workers then (killed, crashed or recycled and replaced by the master): the larger;
#: * ``master_restarted`` - 1 when the master (the process the trial started or attached to) had died by
#:   the end of the load, or was another process then.
#:
#: A trial with either is never valid: its ``trial_status`` is ``"failed"`` and its ``reason`` says
#: which (the summary and the report count such trials apart); a resume redoes it.
FAULT_COLUMNS = ("workers_replaced", "master_restarted")

#: How evenly the measured load reached the workers, in a trial's row (NaN where it was not measured, and
#: absent from tables written before it):
#:
#: * ``worker_share`` - the least-loaded worker's part of the load as a share of the busiest worker's
#:   (:func:`tuna_lab.measure.cpu.worker_balance`): its requests where the server says which worker
#:   served each (the lab server), else its threads' CPU seconds over the load; 1.0 with one worker.
#:
#: * ``reloads`` - loads of the trial refused before the one measured because they left a worker out (the
#:   load is sent again on fresh connections, at most twice; 0 when the first load reached every worker);
#:   the first refused load's reason is in ``reload_reason`` ("" when none).
#:
#: A trial whose ``worker_share`` is below the fair share ``pin`` also asks of every worker (a quarter of
#: the busiest's) measured fewer workers than the configuration has - the kernel gave the load
#: generator's connections to the others - and is never valid: its ``trial_status`` is ``"failed"``, its
#: ``reason`` names the worker, and the summary and the report count such trials apart
#: (:func:`tuna_lab.measure.store.valid_rows` is the one definition of a valid trial).
BALANCE_COLUMNS = ("worker_share", "reloads")


def fair_share():
    """The least share of the busiest worker's load that every worker must do in a valid trial.

    The share ``pin``'s traffic asks of every worker too (a worker is told
    by its activity only once it did that much): one constant, kept there.

    Examples
    --------
    >>> fair_share()
    0.25
    """
    from ..live.traffic import FAIR_SHARE

    return FAIR_SHARE

#: What the scheduler did during a trial's load, in its row (:class:`tuna_lab.measure.cpu.SchedEvidence`,
#: read through :mod:`tuna_lab.machine.sched` before and after the load). *Server threads* are every
#: thread of the master, its front ends and helpers, and its workers; the *serving CPUs* are the CPUs
#: any of them may run on (``server_cpus``). Each is a change over the load; NaN where this machine
#: does not expose it, and in rows of results written before these columns:
#:
#: * ``run_delay_seconds`` / ``run_delay_per_request`` - time the server threads spent runnable but
#:   waiting on a run queue for a CPU (schedstat), in seconds, in total and per ok request;
#: * ``migrations`` / ``migrations_per_request`` - times a server thread was moved to another CPU
#:   (``se.nr_migrations``; NaN where the kernel does not expose it, and the manifest's
#:   ``migrations_note`` says why);
#: * ``involuntary_switches`` / ``involuntary_per_request`` - times a server thread was preempted;
#: * ``voluntary_switches`` / ``voluntary_per_request`` - times a server thread gave its CPU up (it
#:   blocked: waiting for a request, a lock, the pool's barrier);
#: * ``timeslices`` - times a server thread was given a CPU;
#: * ``foreign_cpu_seconds`` - CPU seconds used on the serving CPUs by everything that is not the server
#:   (other processes, this load generator when it shares them, interrupts): their busy time in
#:   ``/proc/stat`` less the server threads' CPU time, at least 0 (``/proc/stat`` counts in clock ticks,
#:   10 ms; a server thread that ended during the load counts as foreign);
#: * ``foreign_cpu_share`` - ``foreign_cpu_seconds`` over (the load's wall seconds x the serving CPUs):
#:   the share of the serving CPUs' time others used;
#: * ``irqs`` / ``irqs_per_request`` - interrupts handled on the serving CPUs (``/proc/interrupts``);
#: * ``cpu_pressure_seconds`` - time during which some runnable task waited for a CPU, machine-wide
#:   (``/proc/pressure/cpu`` ``some``);
#: * ``throttled_seconds`` / ``nr_throttled`` - time the master's cgroup (and its ancestors) was stopped
#:   by its CFS quota, and the periods in which it was (``cpu.stat``);
#: * ``front_cpu_seconds`` / ``front_cpu_per_request`` - CPU seconds of the master, front ends and
#:   helpers: the server's CPU that is not its workers' (``cpu_seconds``); an MLServer master parsing
#:   requests, a LitServe API process;
#: * ``evidence_overhead_seconds`` - CPU seconds the readings themselves cost the measuring process.
EVIDENCE_COLUMNS = ("run_delay_seconds", "run_delay_per_request", "migrations", "migrations_per_request",
                    "involuntary_switches", "involuntary_per_request", "voluntary_switches", "voluntary_per_request",
                    "timeslices", "foreign_cpu_seconds", "foreign_cpu_share", "irqs", "irqs_per_request",
                    "cpu_pressure_seconds", "throttled_seconds", "nr_throttled", "front_cpu_seconds",
                    "front_cpu_per_request", "evidence_overhead_seconds")

#: The scheduler's counters of each ``threads.parquet`` row (its threads' sums over the load; absent in
#: results written before them): ``run_delay_seconds``, ``timeslices``, ``migrations`` (NaN where the
#: kernel does not expose them), ``voluntary_switches``, ``involuntary_switches`` - as in
#: :data:`EVIDENCE_COLUMNS`.
THREAD_EVIDENCE_COLUMNS = ("run_delay_seconds", "timeslices", "migrations", "voluntary_switches",
                           "involuntary_switches")

# -- latency percentiles -----------------------------------------------------------------

#: The latency percentiles every summary reports.
PERCENTILES = (50, 95, 99)


def percentiles(values, prefix=""):
    """``{p50, p95, p99, mean}`` of ``values`` (NaN for each when there are none).

    Parameters
    ----------
    values : array-like of float
        Latencies in seconds (already filtered to the requests that count).
    prefix : str
        Prepended with ``_`` to every key (``"server"`` -> ``server_p99``).

    Returns
    -------
    dict of str to float

    Examples
    --------
    >>> percentiles([0.0, 100.0])
    {'p50': 50.0, 'p95': 95.0, 'p99': 99.0, 'mean': 50.0}
    >>> percentiles([], prefix="client")["client_p99"]
    nan
    """
    values = np.asarray(values, dtype=float)
    head = f"{prefix}_" if prefix else ""
    keys = [f"{head}p{q}" for q in PERCENTILES] + [f"{head}mean"]
    if values.size == 0:
        return dict.fromkeys(keys, math.nan)
    stats = [*np.percentile(values, PERCENTILES), values.mean()]
    return {k: float(v) for k, v in zip(keys, stats)}
