"""Pin-and-measure: run the article's experiment on this machine and keep every record.

One *cell* is an application ``{W, T, model, batch}`` measured under several
policies. For every trial the policies run in a fresh random order (seeded
and recorded) so that drift - a warming machine, a noisy neighbour - does not
favour one; each (trial, policy) starts its own server, warms it up, sends
the load, and stops it. Every request becomes a row of a tidy table
(Parquet, CSV on request) next to a manifest (machine, kernel, topology,
library versions, git commit, seeds, command line), so a result can be
re-analysed without re-running it. A sweep is a grid of cells; each finished
cell is written at once, and a re-run skips the cells already finished. A
sweep given a Dask client runs its cells on the cluster's machines
(:mod:`tuna_lab.measure.cluster`) and writes each under ``<out>/<machine>/``;
:func:`load_results` reads both layouts.

Examples
--------
>>> from tuna_lab.measure.experiment import Config, run
>>> result = run(Config(2, 2, "small", 100), ["cfs", "tuna-scatter"], trials=2,
...              requests=50, out="results/x")                        # doctest: +SKIP
>>> result.trials[["policy", "trial", "p99"]]                       # doctest: +SKIP
"""

import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from .._checks import format_cpulist, one_line, positive_int
from ..errors import CpuAccountingError, ExperimentError, TunaError
from ..machine import host
from ..machine.limits import Limits
from ..machine.reserve import reserve_client_cpus
from ..server.models import MODEL_FEATURES
from ..server.openmp import LIBGOMP_DEFAULT_WAIT, wait_policy_env
from . import schema
from .cpu import CpuSampler, account, summarise
# Re-exported: the cell names and CPU columns are defined with the rest of the on-disk schema.
from .schema import CPU_COLUMNS, GENERATOR_COLUMNS, cell_key, percentiles
# Re-exported: where results are written and read back.
from .store import finished_keys, load_results, load_thread_cpu, machine_name, write_cell

__all__ = ["Config", "Result", "ExperimentError", "run", "grid", "load_results", "ARTICLE_GRID",
           "CPU_COLUMNS", "load_thread_cpu", "cell_key", "write_cell", "machine_name", "check_policies"]

#: The article's server configurations (workers x OpenMP threads on 32 logical cores).
ARTICLE_GRID = {"workers": (2, 4, 6, 8, 12, 16), "threads": (2, 4, 6, 8, 12, 16), "cpus": 32}


@dataclass(frozen=True)
class Config:
    """One application of the article: W workers x T threads serving ``model`` with batches of ``batch``.

    ``wait_policy`` (``OMP_WAIT_POLICY``: ``"default"``, ``"passive"``,
    ``"active"``) and ``spincount`` (``GOMP_SPINCOUNT``) set how the OpenMP
    threads wait between requests; they are factors of the cell like W and T.
    """

    workers: int
    threads: int
    model: str = "medium"
    batch: int = 100
    wait_policy: str = "default"
    spincount: int | None = None

    def __post_init__(self):
        for name in ("workers", "threads", "batch"):
            positive_int(name, getattr(self, name), ExperimentError)
        if self.model not in MODEL_FEATURES:
            raise ExperimentError(f"unknown model {self.model!r}; choose from {', '.join(MODEL_FEATURES)}")
        try:
            wait_policy_env(self.wait_policy, self.spincount)
        except CpuAccountingError as exc:
            raise ExperimentError(str(exc)) from None

    @property
    def key(self):
        """The name of the cell's folder (:func:`~tuna_lab.measure.schema.cell_key`)."""
        return cell_key(self.workers, self.threads, self.model, self.batch, self.wait_policy, self.spincount)


@dataclass
class Result:
    """What one cell produced: the raw request rows, one row per trial, the manifest, and per-thread CPU."""

    requests: pd.DataFrame
    trials: pd.DataFrame
    manifest: dict
    path: str | None = None
    threads: pd.DataFrame | None = None


def _concat(frames):
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def check_policies(policies):
    """``policies`` without repeats, in order; :class:`ExperimentError` if empty or one is unknown.

    Examples
    --------
    >>> check_policies(["cfs", "round-robin", "cfs"])
    ['cfs', 'round-robin']
    """
    from ..placement.policies import POLICIES

    policies = list(dict.fromkeys(policies))
    if not policies:
        raise ExperimentError("no policies given")
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        raise ExperimentError(f"unknown policy {bad[0]!r}; choose from {', '.join(POLICIES)}")
    return policies


def _git_commit():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain"], capture_output=True, text=True,
                               timeout=10)
        if out.returncode == 0:
            return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def _versions():
    from importlib import metadata

    out = {}
    for dist in ("tuna_lab", "xgboost-cpu", "xgboost", "gunicorn", "cvxpy", "highspy", "numpy", "pandas",
                 "aiohttp", "pyarrow"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def manifest(config, policies, trials, requests, seed, extra=None):
    """Everything needed to interpret (or repeat) a cell, as a JSON-able dict.

    ``"limits"`` records what the process could really use (affinity, cgroup
    cpuset, CPU quota, isolated CPUs, the effective CPU count; see
    :class:`~tuna_lab.machine.limits.Limits`): a quota below the CPUs the
    threads ran on means the latencies measured throttling. ``"hostname"``
    and ``"fingerprint"`` (:func:`~tuna_lab.machine.fingerprint.fingerprint`
    of the CPUs this process may use) name the machine it ran on.
    """
    from ..machine.fingerprint import fingerprint
    from ..machine.topology import Topology

    topo = Topology.from_sysfs()
    return {
        "config": asdict(config), "cell": config.key, "policies": list(policies), "trials": trials,
        "requests": requests, "seed": seed, "hostname": platform.node(), "fingerprint": fingerprint(topo),
        "cpu_model": host.cpu_model(), "kernel": platform.release(),
        "python": platform.python_version(), "cpus": list(topo.cpus),
        "topology": {k: v for k, v in topo.to_dict().items() if k != "distance"},
        "limits": Limits.read().to_dict(),
        "versions": _versions(), "git_commit": _git_commit(), "command": sys.argv,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **(extra or {}),
    }


@dataclass(frozen=True)
class _Plan:
    """What the trials of one cell run: the same for every (trial, policy) but the policy and its place."""

    config: Config
    #: One tuple of policies per trial, in the order they run.
    orders: tuple
    requests: int
    concurrency: int | None
    warmup: int
    #: The request body, the same bytes for every request of every trial.
    body: bytes
    #: CPUs the server may use: this process's, minus the client CPUs (a column of every row,
    #: the C of the subscription W x T / C).
    cpus: int
    #: The load generator's CPUs and the server's machine (:class:`~tuna_lab.machine.reserve.ClientCpus`).
    client: object

    @property
    def runs(self):
        """How many (trial, policy) runs the cell has."""
        return sum(len(order) for order in self.orders)


@dataclass(frozen=True)
class _Measured:
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


def _trial_row(labels, frame, wall, status, reason, cpu=None, generator=None):
    ok = frame[frame["status"] == 200] if len(frame) else frame
    server = ok["server_seconds"].to_numpy(float) if len(ok) else np.array([])
    row = {**labels, "n": int(len(frame)), "ok": int(len(ok)), "failed": int(len(frame) - len(ok)),
           "wall_seconds": wall, "trial_status": status, "reason": reason}
    row.update(dict.fromkeys(CPU_COLUMNS, float("nan")))
    row.update(cpu or {})
    row.update(_generator_columns(generator, len(frame)))
    row.update(percentiles(server))
    row["throughput"] = row["ok"] / wall if wall > 0 else float("nan")
    return row


def run(config, policies, trials=5, requests=1000, out=None, concurrency=None, seed=0, warmup=20,
        progress=None, csv=False, on_trial=None, client_cpus=None):
    """Measure ``config`` under each policy for ``trials`` trials of ``requests`` concurrent requests.

    Parameters
    ----------
    config : Config
    policies : list of str
    trials, requests : int
        The article: 5 trials x 1,000 concurrent requests.
    out : str, optional
        Directory to write the cell into (``requests.parquet``, ``trials.parquet``,
        ``manifest.json``; see :mod:`tuna_lab.measure.schema`); nothing is written
        when ``None``. If the run is interrupted (Ctrl-C), the trials that
        finished are written to ``<out>.partial`` and the interruption re-raised.
    concurrency : int, optional
        Requests in flight; default all of them at once (the article's closed mode).
    seed : int
        Seeds the policy order of every trial and the payload.
    warmup : int
        Requests sent (and discarded) after each server start.
    progress : callable, optional
        Called with one line of text per finished trial.
    csv : bool
        Also write the request and trial tables as CSV.
    on_trial : callable, optional
        Called with a :class:`Result` of each (trial, policy) run as it
        finishes (its rows only), before ``progress``: a cluster worker sends
        them on, so that the trials of a cell whose machine is lost are kept.
    client_cpus : str, iterable of int or ClientCpus, optional
        CPUs for the load generator, kept free of every policy's server
        placement (the server's topology is the rest): a cpulist such as
        ``"6-7"``, ``"none"``, or None for the default - nothing below 8
        usable CPUs, one physical core from 8 up (see
        :func:`~tuna_lab.machine.reserve.reserve_client_cpus`; the choice is
        made on the machine that runs the cell). The manifest's
        ``client_cpus`` records it, with the line that describes it (``note``;
        ``progress`` only reports trials). Either way the generator's own CPU
        is recorded in every trial row
        (:data:`~tuna_lab.measure.schema.GENERATOR_COLUMNS`) and the manifest.

    Returns
    -------
    Result

    Raises
    ------
    ExperimentError
        Bad arguments; client CPUs not usable here, leaving no CPU for the
        server, or fewer than ``config.threads`` for it.

    Examples
    --------
    >>> result = run(Config(2, 2, "small", 20), ["cfs", "round-robin"], trials=2, requests=50)  # doctest: +SKIP
    >>> result.trials.groupby("policy")["p99"].mean()                                         # doctest: +SKIP
    """
    from .load import payload

    policies = check_policies(policies)
    trials = positive_int("trials", trials, ExperimentError)
    requests = positive_int("requests", requests, ExperimentError)
    resolved = reserve_client_cpus(client_cpus, error=ExperimentError)
    resolved.check_threads(config.threads, ExperimentError)
    rng = np.random.default_rng(seed)
    # A fresh random order per trial, drawn up front: the seed alone decides them.
    orders = tuple(tuple(str(p) for p in rng.permutation(policies)) for _ in range(trials))
    plan = _Plan(config, orders, requests, concurrency, warmup, payload(config.model, config.batch, seed=seed),
                 resolved.server.n_logical, resolved)
    meta = manifest(config, policies, trials, requests, seed, {
        "concurrency": concurrency, "warmup": warmup, "wait_policy": config.wait_policy,
        "spincount": config.spincount,
        "wait_policy_default": LIBGOMP_DEFAULT_WAIT if config.wait_policy == "default" else None,
        "cpu_accounting": "schedstat" if os.path.exists("/proc/self/schedstat") else "stat utime+stime",
        "client_cpus": resolved.to_dict()})
    done = []
    t_start = time.monotonic()
    try:
        for measured in _trials(plan):
            done.append(measured)
            if on_trial:
                on_trial(_result([measured], meta))
            if progress:
                progress(_progress_line(plan, measured.row, len(done), t_start))
    except KeyboardInterrupt:
        # Ctrl-C: the server of the running trial was stopped by its context
        # manager; keep what finished next to the cell (a resume redoes the cell).
        if out is not None and done:
            begun = min(len(done) // len(policies) + 1, trials)
            meta.update(orders=[list(o) for o in orders[:begun]], interrupted=True, generator=_generator_total(done))
            write_cell(out.rstrip("/") + schema.PARTIAL_SUFFIX, _result(done, meta), csv)
        raise
    meta.update(orders=[list(o) for o in orders], finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                generator=_generator_total(done))
    result = _result(done, meta)
    if out is not None:
        result.path = write_cell(out, result, csv)
    return result


def _result(done, meta):
    """The :class:`Result` of the (trial, policy) runs ``done``."""
    return Result(_concat([m.requests for m in done if len(m.requests)]), pd.DataFrame([m.row for m in done]),
                  meta, threads=_concat([m.threads for m in done if m.threads is not None]))


def _progress_line(plan, row, done, t_start):
    left = (time.monotonic() - t_start) / done * (plan.runs - done)
    reason = row["reason"]
    server, client = row["cpu_per_request"], row["generator_cpu_per_request"]
    # Last, after the time left: readers of these lines (the live widget) parse up to it.
    cost = "" if np.isnan(server) and np.isnan(client) else \
        f"  CPU/req: server {server * 1e3:.2f} ms, generator {client * 1e3:.2f} ms"
    return (f"{row['cell']} trial {row['trial'] + 1}/{len(plan.orders)} {row['policy']:<13} "
            f"p50 {row['p50'] * 1e3:7.1f} ms p99 {row['p99'] * 1e3:7.1f} ms  "
            f"{row['trial_status']}{(': ' + reason) if reason else ''}  [~{left:.0f} s left]{cost}")


def _server_affinity(srv):
    """``{(pid, role): CPUs}`` the server's threads may run on now, read from /proc.

    Every thread of every live worker (its main thread, and the rest counted
    as OpenMP, as :func:`~tuna_lab.measure.cpu.account` counts them) and of
    the master (role ``"master"``); threads that end while being read are skipped.
    """
    from ..placement.binding import affinity_of, threads_of

    master = srv.master_pid()
    pids = [(pid, None) for pid in srv.worker_pids()] + ([(master, "master")] if master else [])
    allowed = {}
    for pid, role in pids:
        try:
            tids = threads_of(pid)
        except TunaError:
            continue
        for tid in tids:
            try:
                cpus = affinity_of(tid)
            except TunaError:
                continue
            key = (pid, role or ("main" if tid == pid else "openmp"))
            allowed[key] = allowed.get(key, frozenset()) | cpus
    return allowed


def _generator_columns(generator, requests=0):
    """The trial row's :data:`GENERATOR_COLUMNS` from a load frame's ``attrs["generator"]`` (NaN if absent)."""
    row = dict.fromkeys(GENERATOR_COLUMNS, float("nan"))
    row["generator_cpus"] = ""
    row["server_cpus"] = format_cpulist((generator or {}).get("server_cpus") or ())
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


def _generator_total(done):
    """The load generator's cost over the finished runs ``done``, for the manifest."""
    rows = pd.DataFrame([m.row for m in done])
    if rows.empty or rows["generator_cpu_seconds"].isna().all():
        return {"cpu_user": None, "cpu_sys": None, "cpu_seconds": None, "requests": 0, "cpu_per_request": None,
                "runs": int(len(rows))}
    known = rows[rows["generator_cpu_seconds"].notna()]
    seconds = float(known["generator_cpu_seconds"].sum())
    sent = int(known["n"].sum())
    return {"cpu_user": float(known["generator_cpu_user"].sum()), "cpu_sys": float(known["generator_cpu_sys"].sum()),
            "cpu_seconds": seconds, "requests": sent, "cpu_per_request": seconds / sent if sent else None,
            "runs": int(len(known))}


def _cpu_of(sampler, frame, labels):
    """A trial's per-role CPU summary and its per-thread table (``(None, None)`` if not accountable)."""
    try:
        threads = account(sampler, frame)
    except CpuAccountingError:
        return None, None
    ok = int((frame["status"] == 200).sum()) if len(frame) else 0
    cpu = summarise(threads, ok)
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


def _trials(plan):
    """Run every (trial, policy) of ``plan`` in its order, yielding a :class:`_Measured` as each finishes.

    A generator, so that the caller holds every finished run when Ctrl-C
    stops the one in progress (whose server its context manager stops).
    """
    from ..machine.topology import Topology

    topo = Topology.from_sysfs()
    for trial, order in enumerate(plan.orders):
        for pos, policy in enumerate(order):
            yield _measure(plan, _labels(plan, trial, pos, policy), topo)


def _measure(plan, labels, topo):
    """Start a server for one (trial, policy), warm it up, load it while sampling its threads' CPU, stop it."""
    from ..server.launch import Server
    from .load import closed_loop

    config = plan.config
    t0 = time.monotonic()
    frame, status, reason, cpu, per_thread, generator = pd.DataFrame(), "ok", "", None, None, None
    try:
        # die_with_parent: a runner killed outright (SIGKILL, a lost cluster worker) leaves no server.
        # The server places on the machine left once the client CPUs are kept (all of it when none are).
        with Server(config.workers, config.threads, model=config.model, policy=labels["policy"],
                    wait_policy=config.wait_policy, spincount=config.spincount, die_with_parent=True,
                    topology=plan.client.server) as srv:
            # The generator runs pinned to the client CPUs only while it sends (unpinned when none are kept).
            pin = plan.client.cpus or None
            if plan.warmup:
                closed_loop(f"{srv.url}/predict", plan.body, requests=plan.warmup,
                            concurrency=min(plan.warmup, 4), cpus=pin)
            # Every server thread's CPU time, sampled while the load runs.
            with CpuSampler(srv.server_threads(), period=0.1) as sampler:
                frame = closed_loop(f"{srv.url}/predict", plan.body, requests=plan.requests,
                                    concurrency=plan.concurrency, cpus=pin)
            # frame.attrs does not survive every pandas operation: keep the generator's cost now.
            generator = dict(frame.attrs.get("generator") or {})
            # Where the server's threads may run, read live before it stops: off the generator's CPUs.
            allowed = _server_affinity(srv)
            generator["server_cpus"] = sorted(set().union(*allowed.values())) if allowed else []
            if srv.proc is None or srv.proc.poll() is not None:
                status, reason = "failed", "the server died during the trial"
            cpu, per_thread = _cpu_of(sampler, frame, labels)
            if per_thread is not None:
                per_thread, cpu["numa_locality"] = _with_locality(per_thread, topo)
                per_thread = per_thread.assign(cpus=[format_cpulist(allowed.get((pid, role), ()))
                                                     for pid, role in zip(per_thread["pid"], per_thread["role"])])
    except TunaError as exc:
        status, reason = "failed", one_line(exc)
    wall = time.monotonic() - t0
    if len(frame) and (frame["status"] != 200).any() and status == "ok":
        bad = frame.loc[frame["status"] != 200, "error"].iloc[0]
        status, reason = "failed", f"{int((frame['status'] != 200).sum())} requests failed: {bad}"
    if len(frame):
        frame = frame.assign(**labels, load_mode="closed")
    return _Measured(_trial_row(labels, frame, wall, status, reason, cpu, generator), frame, per_thread)


def grid(kind="machine", cpus=None):
    """The article's {W} x {T} grid, as is (``"article"``) or scaled to this machine (``"machine"``).

    The scaled grid keeps the article's over/under-subscription ratios ``WT/C``
    (C = 32 there) while respecting that XGBoost runs at most ``C`` threads per
    worker: ``T' = clip(round(T C / 32), 1, C)``, ``W' = max(1, round(W T / 32 * C / T'))``.
    ``C`` is ``cpus``, by default this process's effective CPU count
    (:attr:`Limits.effective_cpus <tuna_lab.machine.limits.Limits.effective_cpus>`:
    the usable CPUs, capped by a CPU quota), so that a machine whose quota
    allows fewer CPUs than its affinity lists is not sized to measure throttling.
    """
    W, T, C0 = ARTICLE_GRID["workers"], ARTICLE_GRID["threads"], ARTICLE_GRID["cpus"]
    if kind == "article":
        return [(w, t) for w in W for t in T]
    if kind != "machine":
        raise ExperimentError(f"grid must be 'machine' or 'article', got {kind!r}")
    C = cpus or Limits.read().effective_cpus
    out = []
    for w in W:
        for t in T:
            t2 = int(min(max(round(t * C / C0), 1), C))
            w2 = max(1, round(w * t / C0 * C / t2))
            if (w2, t2) not in out:
                out.append((w2, t2))
    return sorted(out)
