"""Pin-and-measure: run the article's experiment on this machine and keep every record.

One *cell* is an application ``{W, T, model, batch}`` measured under several
policies. For every trial the policies run in a fresh random order (seeded
and recorded) so that drift - a warming machine, a noisy neighbour - does not
favour one; each (trial, policy) starts its own server, warms it up, sends
the load, and stops it. Every request becomes a row of a tidy table
(Parquet, CSV on request) next to a manifest (machine, kernel, topology,
library versions, git commit, seeds, command line), so a result can be
re-analysed without re-running it. A cell is finished when every policy
has its valid trials; a re-run of an unfinished one keeps the valid trials
and redoes only the missing ones. A sweep is a grid of cells; each finished
cell is written at once, and a re-run skips the cells already finished. A
sweep given a Dask client runs its cells on the cluster's machines
(:mod:`tuna_lab.measure.sweeps.cluster`) and writes each under ``<out>/<machine>/``;
:func:`load_results` reads both layouts.

Examples
--------
>>> from tuna_lab.measure.experiment import Config, LoadSpec, run
>>> # skipped: starts lab servers and measures them (tests/test_experiment.py does)
>>> result = run(Config(2, 2, "small", 100), ["cfs", "tuna-scatter"], trials=2,
...              load=LoadSpec(requests=50), out="results/x")         # doctest: +SKIP
>>> result.trials[["policy", "trial", "p99"]]                       # doctest: +SKIP
"""

import contextlib
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from .._checks import format_cpulist, positive_int, spec_or_default
from ..errors import CpuAccountingError, ExperimentError
from ..machine import host, procfs
from ..machine.limits import Limits, check_throttling
from ..machine.reserve import reserve_client_cpus
from ..machine.cpufreq import cpu_frequency
from ..machine.sched import MIGRATIONS_NOTE
from ..server.models import MODEL_FEATURES
from ..server.openmp import LIBGOMP_DEFAULT_WAIT, wait_policy_env
from . import schema
from .claims import check_cell_name, check_claim
from .cpulock import lock_cpus
# Re-exported: the cell names and CPU columns are defined with the rest of the on-disk schema.
from .schema import CPU_COLUMNS, cell_key
# Re-exported: what run() takes for its load and its trials.
from .trial_spec import LoadSpec, TrialSpec
# Re-exported: where results are written and read back.
from .store import (valid_rows, cell_state, check_out, load_results, load_thread_cpu, lock_folder, machine_name,
                    write_cell)

__all__ = ["Config", "Result", "ExperimentError", "run", "grid", "load_results", "ARTICLE_GRID",
           "CPU_COLUMNS", "load_thread_cpu", "cell_key", "write_cell", "machine_name", "check_policies",
           "check_resources", "scale_pair", "MAX_RECORD_INT", "LoadSpec", "TrialSpec"]

#: The article's server configurations (workers x OpenMP threads on 32 logical cores).
ARTICLE_GRID = {"workers": (2, 4, 6, 8, 12, 16), "threads": (2, 4, 6, 8, 12, 16), "cpus": 32}

#: The largest integer a record's column can hold (Parquet's int64): a factor of a cell above it
#: (``spincount=10**30``) is refused by :class:`Config`, before any trial runs, not when its records are written.
MAX_RECORD_INT = 2**63 - 1

#: The manifest entries a resume must share with the cell already on disk to keep its valid trials:
#: the cell's factors and load, its seed (so the policy orders), and the machine and CPUs it ran on.
_SAME_RUN = ("cell", "config", "policies", "trials", "requests", "seed", "concurrency", "warmup", "rate", "duration",
             "max_error_rate", "load_mode", "hostname", "fingerprint", "client_cpus", "requests_sent")

# What run() took as keywords before LoadSpec and TrialSpec carried them: refused at once, in one line.
_MOVED = {**{k: f"load=LoadSpec({k}=...)" for k in ("requests", "concurrency", "rate", "duration")},
          **{k: f"trial=TrialSpec({k}=...)" for k in ("seed", "warmup", "max_error_rate", "client_cpus")}}


@dataclass(frozen=True)
class Config:
    """One application of the article: W workers x T threads serving ``model`` with batches of ``batch``.

    ``wait_policy`` (``OMP_WAIT_POLICY``: ``"default"``, ``"passive"``,
    ``"active"``) and ``spincount`` (``GOMP_SPINCOUNT``) set how the OpenMP
    threads wait between requests; they are factors of the cell like W and T.

    ``target`` says what serves: ``"lab"`` (tuna_lab's server; ``model`` is
    one of its models), or ``"app"``/``"attached"`` (a user's server, see
    :mod:`tuna_lab.measure.target`; ``model`` is its label and ``batch`` 0,
    the requests being the user's own).

    Every number is a column of the cell's records: one above
    :data:`MAX_RECORD_INT` is refused here, with the rest of bad input.

    Examples
    --------
    >>> Config(1, 1, "small", 10, spincount=10**30)
    Traceback (most recent call last):
    ...
    tuna_lab.errors.ExperimentError: spincount must be at most 9223372036854775807 (a 64-bit record), got a 31-digit number
    """

    workers: int
    threads: int
    model: str = "medium"
    batch: int = 100
    wait_policy: str = "default"
    spincount: int | None = None
    target: str = "lab"

    def __post_init__(self):
        for name in ("workers", "threads") + (("batch",) if self.target == "lab" else ()):
            positive_int(name, getattr(self, name), ExperimentError)
        if self.target != "lab":
            if not self.model or not all(ch.isalnum() or ch in "_." for ch in self.model):
                raise ExperimentError(f"a target's label must be letters, digits, '_' and '.', got {self.model!r}")
        elif self.model not in MODEL_FEATURES:
            raise ExperimentError(f"unknown model {self.model!r}; choose from {', '.join(MODEL_FEATURES)}")
        try:
            wait_policy_env(self.wait_policy, self.spincount)
        except CpuAccountingError as exc:
            raise ExperimentError(str(exc)) from None
        for name in ("workers", "threads", "batch", "spincount"):
            value = getattr(self, name)
            if value is not None and value > MAX_RECORD_INT:
                raise ExperimentError(f"{name} must be at most {MAX_RECORD_INT} (a 64-bit record), got "
                                      f"{_big(value)}")

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


def _big(value):
    """An integer in a few characters: a message about a huge one stays one short line."""
    digits = len(str(value))
    return str(value) if digits <= 24 else f"a {digits}-digit number"


def check_policies(policies):
    """``policies`` without repeats, in order; :class:`ExperimentError` if empty or one is unknown.

    Examples
    --------
    >>> check_policies(["cfs", "round-robin", "cfs"])
    ['cfs', 'round-robin']
    """
    from ..placement.policies import policy_names

    policies = list(dict.fromkeys(policies))
    if not policies:
        raise ExperimentError("no policies given")
    known = policy_names()
    bad = [p for p in policies if p not in known]
    if bad:
        raise ExperimentError(f"unknown policy {bad[0]!r}; choose from {', '.join(known)}")
    return policies


def check_resources(target, requests, concurrency=None, rate=None):
    """Refuse (:class:`ExperimentError`) a measurement this machine cannot make, before any server starts.

    Checked: the file descriptors the load needs (one socket per request in
    flight; the soft limit is raised up to the hard one when that suffices,
    see :func:`~tuna_lab.measure.loadgen.load.ensure_fds`); and for the lab server,
    its request body against the server's limit (``TUNA_LAB_MAX_BODY``), its
    batch against the rows a request may carry (``TUNA_LAB_MAX_ROWS``, see
    :func:`~tuna_lab.server.app.max_rows`), and its model: cached, or a cache
    folder it can be trained into. Each would otherwise fail every trial,
    after a server start each, or - the model - in every worker at once.

    Parameters
    ----------
    target : Target
    requests, concurrency, rate
        As a :class:`~tuna_lab.measure.trial_spec.LoadSpec` has them (:func:`run`'s ``load``).

    Examples
    --------
    >>> from tuna_lab.measure.target import LabTarget
    >>> check_resources(LabTarget(Config(1, 1, "large", 5000)), 10)       # doctest: +SKIP
    Traceback (most recent call last):
    ...
    tuna_lab.errors.ExperimentError: a request body of ... bytes (batch 5000 of large) exceeds the server's ...
    """
    from ..server.app import MAX_BODY_BYTES
    from ..errors import ServerError
    from ..server.models import cache_dir, check_model_cache, model_path
    from .loadgen.load import ensure_fds
    from .target import check_batch

    # The open loop's sockets are capped by its max_in_flight (1000 by default), the closed loop's by the requests.
    in_flight = 1000 if rate is not None else None
    connections = min(x for x in (requests, concurrency, in_flight) if x is not None)
    ensure_fds(connections, ExperimentError)
    if target.kind != "lab":
        return
    config = target.config
    check_batch(config.model, config.batch)
    try:
        limit = int(os.environ.get("TUNA_LAB_MAX_BODY") or MAX_BODY_BYTES)
    except ValueError as exc:
        raise ExperimentError(f"the server's limits do not parse: {exc}") from None
    body = max(len(b) for b in target.requests.bodies)
    if body > limit:
        raise ExperimentError(f"a request body of {body} bytes (batch {config.batch} of {config.model}) exceeds the "
                              f"server's limit of {limit} bytes (TUNA_LAB_MAX_BODY); use a smaller batch")
    if not model_path(config.model).exists():
        folder = cache_dir()
        parent = folder
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise ExperimentError(f"model {config.model!r} is not cached and cannot be trained into {folder} "
                                  f"({parent} is not a writable folder); set TUNA_LAB_CACHE to one that is")
    try:
        check_model_cache(config.model)       # another user's folder or model: refused before any trial
    except ServerError as exc:
        raise ExperimentError(str(exc)) from None


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
                 "pyarrow"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def manifest(config, policies, trials, requests, seed, extra=None, target=None):
    """Everything needed to interpret (or repeat) a cell, as a JSON-able dict.

    ``"limits"`` records what the process could really use (affinity, cgroup
    cpuset, CPU quota, isolated CPUs, the effective CPU count; see
    :class:`~tuna_lab.machine.limits.Limits`): a quota below the CPUs the
    threads ran on means the latencies measured throttling. ``"hostname"``
    and ``"fingerprint"`` (:func:`~tuna_lab.machine.fingerprint.fingerprint`
    of the CPUs this process may use) name the machine it ran on.
    ``"cpu_frequency"`` (of the serving CPUs ``extra["client_cpus"]`` names) and
    ``"wait_knobs"`` (of ``target``'s server) are :mod:`~tuna_lab.measure.evidence`'s.
    """
    from .evidence import server_evidence
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
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **server_evidence(config, (extra or {}).get("client_cpus", {}).get("server_cpus") or topo.cpus, target),
        **(extra or {}),
    }


def run(config, policies, trials=5, *, load=None, trial=None, out=None, csv=False, progress=None, on_trial=None,
        target=None, strict=False, **moved):
    """Measure a target under each policy for ``trials`` trials of ``load``.

    The policies run in a fresh seeded order every trial; with ``out``, each finished run is on disk
    at once, and a run into an unfinished cell measures only the runs it misses.

    Parameters
    ----------
    config : Config or None
        The lab server's cell (W, T, model, batch, wait policy); None with a ``target`` (its W and T).
    policies : list of str
        Registered policy names.
    trials : int
        Trials per policy.
    load : LoadSpec, optional
        Each trial's load (:class:`~tuna_lab.measure.trial_spec.LoadSpec`): requests per trial and in
        flight, or an open loop's rate and duration; default ``LoadSpec()``, 1,000 requests all at once.
    trial : TrialSpec, optional
        Seed, warm-up, failures allowed and the load generator's CPUs
        (:class:`~tuna_lab.measure.trial_spec.TrialSpec`; default ``TrialSpec()``).
    out : str, optional
        The cell folder to write (:mod:`tuna_lab.measure.schema`); None writes nothing.
    progress, on_trial : callable, optional
        Called with one line of text per finished trial; with a :class:`Result` of each run (its rows).
    target : Target, optional
        What is measured (:mod:`tuna_lab.measure.target`); default the lab server of ``config``.
    csv, strict : bool
        Also write CSV tables; refuse rather than warn when the CPU quota would throttle the threads.
    **moved
        The keywords ``run`` took before the specs carried them (``requests``, ``seed``, ...): each is
        refused in one line that names its new place.

    Returns
    -------
    Result

    Raises
    ------
    ExperimentError
        Bad arguments or client CPUs; with ``strict``, a throttling quota; CPUs held by another run;
        a cell name too long for the file system, or an ``out`` whose folder another command's results
        claim (:mod:`tuna_lab.measure.claims`): all before any server starts.
    StoreError
        A result could not be written; the runs written before stay in ``<out>.partial``.
    TargetError
        A target that cannot be measured; nothing was changed then.

    Notes
    -----
    See docs/experiment.md, sections "Losing nothing, mixing nothing" (partial cells, resume, CPU
    locks, throttling) and "The load generator: its CPUs and its cost" (the default ``client_cpus``).

    Examples
    --------
    >>> # skipped: starts lab servers and measures them (tests/test_experiment.py does)
    >>> result = run(Config(2, 2, "small", 20), ["cfs", "round-robin"], trials=2,
    ...              load=LoadSpec(requests=50), trial=TrialSpec(seed=3))          # doctest: +SKIP
    >>> run(Config(1, 1, "small", 10), ["cfs"], requests=50)
    Traceback (most recent call last):
    ...
    tuna_lab.errors.ExperimentError: run() takes requests as load=LoadSpec(requests=...)
    """
    from .attached import AttachedTarget
    from .target import LabTarget
    from .trials import TrialPlan, run_trials

    if moved:
        name = sorted(moved)[0]
        if name in _MOVED:
            raise ExperimentError(f"run() takes {name} as {_MOVED[name]}")
        raise ExperimentError(f"run() has no option {name!r}")
    load = spec_or_default("load", load, LoadSpec, ExperimentError)
    trial = spec_or_default("trial", trial, TrialSpec, ExperimentError)
    # Both specs were checked when they were made; run() reads them.
    requests, concurrency, rate, duration = load.requests, load.concurrency, load.rate, load.duration
    seed, warmup, max_error_rate, client_cpus = trial.seed, trial.warmup, trial.max_error_rate, trial.client_cpus
    policies = check_policies(policies)
    trials = positive_int("trials", trials, ExperimentError)
    if out is not None:
        check_out(out)
    if target is None:
        if config is None:
            raise ExperimentError("give a config (the lab server) or a target")
        target = LabTarget(config, seed=seed)
    else:
        if isinstance(target, AttachedTarget):
            target.check()          # bad input refused here, before any mask is read or changed
        config = Config(target.workers, target.threads, target.label, 0, target=target.kind)
    if out is not None:
        # Before any server starts: a cell name the file system cannot hold, or a folder whose cells are
        # another command's (a sweep's, a tune's, a live measurement's), would be found only after measuring.
        check_cell_name(out)
        check_claim(os.path.dirname(os.path.abspath(out.rstrip("/"))) or ".", "run",
                    {"cell": os.path.basename(out.rstrip("/")), "policies": list(policies), "trials": trials,
                     "requests": requests, "seed": seed, "concurrency": concurrency})
    check_throttling(config.workers * config.threads, strict=strict, error=ExperimentError)
    # A running server keeps its CPUs: plans are made for those its master may use, less --front-cpus.
    machine = target.machine() if isinstance(target, AttachedTarget) else None
    check_resources(target, requests, concurrency, rate)
    resolved = reserve_client_cpus(client_cpus, topology=machine, error=ExperimentError)
    if machine is not None and not set(resolved.server.cpus) <= set(machine.cpus):
        raise ExperimentError(f"the client CPUs leave the server CPUs {format_cpulist(resolved.server.cpus)}, but its "
                              f"plans are made for {format_cpulist(machine.cpus)} (its master's, less front_cpus): "
                              "choose them on target.machine()")
    resolved.check_threads(config.threads, ExperimentError)
    rng = np.random.default_rng(seed)
    # A fresh random order per trial, drawn up front: the seed alone decides them.
    orders = tuple(tuple(str(p) for p in rng.permutation(policies)) for _ in range(trials))
    meta = manifest(config, policies, trials, requests, seed, {
        "concurrency": concurrency, "warmup": warmup, "wait_policy": config.wait_policy,
        "spincount": config.spincount, "rate": rate, "duration": duration, "max_error_rate": max_error_rate,
        "load_mode": load.mode,
        "wait_policy_default": LIBGOMP_DEFAULT_WAIT if config.wait_policy == "default" else None,
        "cpu_accounting": "schedstat" if procfs.schedstat_available() else "stat utime+stime",
        "migrations_note": MIGRATIONS_NOTE,
        "client_cpus": resolved.to_dict(), "requests_sent": target.requests.describe()}, target=target)
    # Each finished run is on disk here at once: a SIGKILL loses at most the run in progress.
    partial = None if out is None else out.rstrip("/") + schema.PARTIAL_SUFFIX
    t_start = time.monotonic()
    # One measurement per results folder: held from the first trial to the written cell.
    with contextlib.ExitStack() as held:
        done, attempt = [], 0
        if out is not None:
            held.enter_context(lock_folder(os.path.dirname(os.path.abspath(out.rstrip("/"))) or "."))
            # A resume: the valid runs an earlier attempt left are kept, and only the others run.
            done, attempt = _earlier(out.rstrip("/"), partial, meta, orders, progress)
        kept = len(done)
        meta.update(attempts=attempt + 1, kept_runs=kept)
        # And one measurement per CPU of this machine: the server's and the load generator's.
        held.enter_context(lock_cpus(set(resolved.server.cpus) | set(resolved.cpus), progress))
        target.start(resolved.server)
        try:
            plan = TrialPlan(config, target, orders, requests, concurrency, warmup, resolved.server.n_logical, resolved,
                             rate=rate, duration=duration, seed=seed, max_error_rate=float(max_error_rate),
                             skip=frozenset((m.row["trial"], m.row["policy"]) for m in done))
            warned = False
            for measured in run_trials(plan):
                measured.row["attempt"] = attempt
                done.append(measured)
                if partial is not None:
                    _keep_partial(partial, done, meta, orders, csv)
                if on_trial:
                    on_trial(_result([measured], meta))
                if progress and measured.row.get("server_timing_unparsed") and not warned:
                    warned = True
                    progress(f"warning: Server-Timing headers that do not parse are ignored "
                             f"(first: {measured.row['server_timing_example']!r})")
                if progress:
                    progress(_progress_line(plan, measured.row, len(done) - kept, plan.runs - kept, t_start))
        except KeyboardInterrupt:
            # Ctrl-C: the server of the running trial was stopped by its context
            # manager; the finished trials are in the partial folder already - say why it stopped.
            if partial is not None and done:
                _keep_partial(partial, done, {**meta, "interrupted": True, "target": target.describe(),
                                              "placements": target.placements(), "plans": target.plans()},
                              orders, csv)
            raise
        finally:
            # Also on an error, Ctrl-C or SIGTERM: a running server gets its masks back.
            target.stop()
        meta.update(orders=[list(o) for o in orders], finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    generator=_generator_total(done), target=target.describe(), placements=target.placements(),
                    plans=target.plans(), latency=sorted({m.row["latency"] for m in done}),
                    time=_time_spent(done[kept:], t_start))
        # The clocks again, just after the load: a governor that scales with load shows it here.
        meta["cpu_frequency"]["end"] = cpu_frequency(meta["cpu_frequency"]["cpus"])
        result = _result(done, meta)
        if out is not None:
            result.path = write_cell(out, result, csv)
            # Only once the whole cell is on disk: until then the partial folder is all there is.
            shutil.rmtree(partial, ignore_errors=True)
        return result


def _keep_partial(partial, done, meta, orders, csv):
    """Write the runs ``done`` so far as the partial cell ``partial`` (fsynced, swapped in whole).

    The whole partial cell is rewritten after each run: it is small beside a
    trial's time, and so the folder is always one readable cell, never a
    pile of pieces from different attempts.
    """
    begun = max(int(m.row["trial"]) for m in done) + 1
    meta = {**meta, "orders": [list(o) for o in orders[:begun]], "partial": True,
            "generator": _generator_total(done)}
    write_cell(partial, _result(done, meta), csv)


def _earlier(out, partial, meta, orders, say=None):
    """The valid runs an earlier attempt of the cell ``out`` left, as :class:`Measured` runs, and this attempt's number.

    Looked for in ``<out>.partial`` (an attempt stopped mid-cell) and in
    ``out`` (a cell written with some policy short of its valid trials; a
    finished one is measured anew, and replaced); the one with more valid
    runs is kept. ``([], 0)`` for a new cell, and
    when the earlier attempt ran otherwise (:data:`_SAME_RUN`, or other
    policy orders) or its records cannot be read - ``say`` is told why.
    """
    from .trials import Measured

    key = meta["cell"]
    best = ([], 0)
    for folder in (partial, out):
        state = cell_state(folder)
        if state.status == "missing" or (folder == out and state.finished):
            continue
        if state.status == "corrupt":
            _say(say, f"resume: {key}: measured whole again: {state.reason}")
            continue
        old = _read_cell(folder)
        if isinstance(old, str):
            _say(say, f"resume: {key}: measured whole again: {old}")
            continue
        manifest, trials, requests, threads = old
        other = [k for k in _SAME_RUN if manifest.get(k) != _jsonable(meta.get(k))]
        older = manifest.get("orders")
        if not other and not (isinstance(older, list) and older == [list(o) for o in orders[:len(older)]]):
            other = ["orders"]
        if other:
            _say(say, f"resume: {key}: measured whole again: the cell there ran with other {', '.join(other)}")
            continue
        runs = []
        for _, row in trials[valid_rows(trials)].iterrows():
            row = {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
            row.setdefault("attempt", 0)
            at = {"trial": row["trial"], "policy": row["policy"]}
            mine = _rows_of(threads, at)
            runs.append(Measured(row, _rows_of(requests, at), mine if len(mine) else None))
        attempts = manifest.get("attempts", 1)
        attempts = attempts if isinstance(attempts, int) and not isinstance(attempts, bool) and attempts > 0 else 1
        if len(runs) > len(best[0]) or not best[0]:
            best = (runs, attempts)
    if best[0]:
        n = sum(len(o) for o in orders) - len(best[0])
        _say(say, f"resume: {key}: keeping {len(best[0])} valid runs of an earlier attempt, running the "
                  f"{n} missing")
    return best[0], best[1] if best[0] else 0


def _say(say, line):
    if say:
        say(line)


def _jsonable(value):
    """``value`` as it reads back from a manifest (tuples become lists): what a resume compares."""
    import json

    return json.loads(json.dumps(value, default=str))


def _read_cell(folder):
    """``(manifest, trials, requests, threads)`` of the cell ``folder``, or why it cannot be read (a str)."""
    from .store import read_manifest

    try:
        manifest = read_manifest(folder)
        tables = []
        for name in (schema.TRIALS, schema.REQUESTS, schema.THREADS):
            file = os.path.join(folder, name)
            tables.append(pd.read_parquet(file) if os.path.exists(file) and os.path.getsize(file) else pd.DataFrame())
    except Exception as exc:  # pyarrow raises many types for a damaged file
        return f"{folder} is not readable ({type(exc).__name__})"
    if not {"trial", "policy"} <= set(tables[0].columns):
        return f"{folder}: its trials table has no trial and policy columns"
    return (manifest, *tables)


def _rows_of(frame, at):
    """The rows of ``frame`` (a requests or threads table) of one (trial, policy) ``at``."""
    if not len(frame) or not {"trial", "policy"} <= set(frame.columns):
        return pd.DataFrame()
    return frame[(frame["trial"] == at["trial"]) & (frame["policy"] == at["policy"])].reset_index(drop=True)


def _result(done, meta):
    """The :class:`Result` of the (trial, policy) runs ``done``, in the order they have in the cell."""
    done = sorted(done, key=lambda m: (int(m.row["trial"]), int(m.row["order"])))
    return Result(_concat([m.requests for m in done if len(m.requests)]), pd.DataFrame([m.row for m in done]),
                  meta, threads=_concat([m.threads for m in done if m.threads is not None]))


def _progress_line(plan, row, done, todo, t_start):
    """A finished run in one line; ``done`` of the ``todo`` runs this attempt makes are finished."""
    left = (time.monotonic() - t_start) / done * (todo - done)
    reason = row["reason"]
    server, client = row["cpu_per_request"], row["generator_cpu_per_request"]
    # Last, after the time left: readers of these lines (the live widget) parse up to it.
    cost = "" if np.isnan(server) and np.isnan(client) else \
        f"  CPU/req: server {server * 1e3:.2f} ms, generator {client * 1e3:.2f} ms"
    reloads = row.get("reloads")
    # A load refused for leaving a worker out, and sent again: said, never dropped silently.
    again = (f" (its load was sent again {int(reloads)}x on fresh connections; the first: {row['reload_reason']})"
             if isinstance(reloads, (int, float)) and reloads > 0 else "")
    return (f"{row['cell']} trial {row['trial'] + 1}/{len(plan.orders)} {row['policy']:<13} "
            f"p50 {row['p50'] * 1e3:7.1f} ms p99 {row['p99'] * 1e3:7.1f} ms  "
            f"{row['trial_status']}{(': ' + reason) if reason else ''}{again}  [~{left:.0f} s left]{cost}")


def _time_spent(done, t_start):
    """Where the cell's wall time went, for the manifest: measuring apart from starting and stopping servers."""
    rows = pd.DataFrame([m.row for m in done])
    spent = {"total_seconds": time.monotonic() - t_start,
             "measuring_seconds": float(rows["wall_seconds"].sum()) if len(rows) else 0.0}
    for column in schema.PHASE_COLUMNS:
        spent[column] = float(rows[column].sum()) if column in rows else 0.0
    return spent


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
    W, T = ARTICLE_GRID["workers"], ARTICLE_GRID["threads"]
    if kind == "article":
        return [(w, t) for w in W for t in T]
    if kind != "machine":
        raise ExperimentError(f"grid must be 'machine' or 'article', got {kind!r}")
    C = cpus or Limits.read().effective_cpus
    return sorted({scale_pair(w, t, C) for w in W for t in T})


def scale_pair(workers, threads, cpus):
    """The article's ``workers x threads`` (on its 32 CPUs) scaled to ``cpus``, keeping ``WT/C``.

    ``T' = clip(round(T C / 32), 1, C)``, ``W' = max(1, round(W T / 32 * C / T'))``:
    what :func:`grid` ``("machine")`` does to each of the article's pairs.

    Examples
    --------
    >>> scale_pair(4, 4, 32), scale_pair(16, 16, 2), scale_pair(4, 4, 8)
    ((4, 4), (16, 1), (4, 1))
    """
    C0 = ARTICLE_GRID["cpus"]
    t2 = int(min(max(round(threads * cpus / C0), 1), cpus))
    return max(1, round(workers * threads / C0 * cpus / t2)), t2
