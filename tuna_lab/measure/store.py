"""The result store: writing a cell, the one rule of a finished cell, and reading results back.

A cell is a folder of the files :mod:`tuna_lab.measure.schema` names; it is
written whole into a temporary folder and renamed in (:func:`write_cell`),
with the manifest last, so that :func:`is_finished` - the only test of "is
this cell done?" that a resume, a cluster sweep or a reader uses - never sees
half a cell. :func:`load_results` and :func:`load_thread_cpu` read a cell, a
sweep (``<path>/<cell>``) or a cluster sweep (``<path>/<machine>/<cell>``).

Examples
--------
>>> from tuna_lab.measure.store import load_results
>>> requests, trials, manifests = load_results("notebooks/data/sweep-2cpu")   # the sweep notebook 06 reads
>>> len(manifests), sorted(trials["policy"].unique())
(18, ['cfs', 'round-robin', 'tuna-scatter'])
"""

import contextlib
import fcntl
import json
import os
import shutil
import threading

import pandas as pd

from ..errors import ExperimentError, StoreError
from . import schema

__all__ = ["check_out", "lock_folder", "write_cell", "is_finished", "finished_keys", "finished_cells", "load_results",
           "load_thread_cpu", "machine_name", "SWEEP_FILE", "write_sweep_file", "read_sweep_file", "write_json"]

#: The name of a sweep's settings file, written in its folder before the first cell.
SWEEP_FILE = "sweep.json"


def _concat(frames):
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def check_out(out, what="out"):
    """Refuse (:class:`ExperimentError`) a results folder that could not be written, before anything runs.

    ``out`` must be a folder or not exist yet; then the nearest folder that
    exists above it must be writable. Measuring first and failing to write
    afterwards would lose every trial.

    Examples
    --------
    >>> check_out("/proc/version")
    Traceback (most recent call last):
    ...
    tuna_lab.errors.ExperimentError: out /proc/version is a file, not a folder
    """
    path = os.path.abspath(os.fspath(out))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ExperimentError(f"{what} {out} is a file, not a folder")
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ExperimentError(f"{what} {out}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ExperimentError(f"{what} {out}: {parent} is not writable")
    return out


#: The name of a results folder's lock file (:func:`lock_folder`).
LOCK_NAME = ".tuna-lab.lock"
# Folders this process holds: realpath -> [fd, owning thread, depth]. A sweep holds its folder and
# each run() inside it takes it again; another thread of this process (a second live experiment)
# is refused like another process.
_HELD = {}
_HELD_GUARD = threading.Lock()


@contextlib.contextmanager
def lock_folder(folder):
    """Hold ``folder`` (a results folder) for one measurement; :class:`ExperimentError` if another holds it.

    Two runs or sweeps writing one folder would measure under each other's
    load and replace each other's cells, so the second is refused at once,
    with one line naming the holder. The lock is ``flock`` on
    ``<folder>/.tuna-lab.lock``: the kernel drops it when the holder
    exits, however it exits. The same thread may take it again (a sweep's
    cells).

    Examples
    --------
    >>> # skipped: creates results/sweep
    >>> with lock_folder("results/sweep"):          # doctest: +SKIP
    ...     pass
    """
    os.makedirs(folder, exist_ok=True)
    key = os.path.realpath(folder)
    me = threading.get_ident()
    with _HELD_GUARD:
        held = _HELD.get(key)
        if held is not None and held[1] == me:
            held[2] += 1
            fd = None
        elif held is not None:
            raise ExperimentError(f"results folder {folder} is in use by another measurement in this process")
        else:
            fd = os.open(os.path.join(key, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "another process"
                os.close(fd)
                raise ExperimentError(f"results folder {folder} is in use by {holder} (one measurement per "
                                      "folder: wait for it, or give another --out)") from None
            os.ftruncate(fd, 0)
            os.write(fd, f"process {os.getpid()}".encode())
            _HELD[key] = [fd, me, 1]
    try:
        yield folder
    finally:
        with _HELD_GUARD:
            held = _HELD[key]
            held[2] -= 1
            if held[2] == 0:
                del _HELD[key]
                os.close(held[0])                       # closing the last descriptor releases the flock


def write_cell(out, result, csv=False):
    """Write ``result`` as the cell folder ``out``, atomically: into a temporary folder, then renamed.

    The files are those of :mod:`tuna_lab.measure.schema`; an existing
    ``out`` is replaced. :func:`run` writes its cells with it, and a cluster
    sweep the cells its machines send back.

    Parameters
    ----------
    out : str
        The cell's folder.
    result : Result
    csv : bool
        Also write the request and trial tables as CSV.

    Returns
    -------
    str
        ``out``.

    Raises
    ------
    StoreError
        The cell could not be written (a full disk, no permission); an
        existing ``out`` is left as it was.

    Examples
    --------
    >>> # skipped: needs a run's result
    >>> write_cell("results/sweep/w2-t2-small-b100", result)            # doctest: +SKIP
    'results/sweep/w2-t2-small-b100'
    """
    out = out.rstrip("/")
    tmp, old = f"{out}.tmp-{os.getpid()}", f"{out}.old-{os.getpid()}"
    try:
        return _write_cell(out, tmp, old, result, csv)
    except OSError as exc:
        # A full disk or a lost permission: the cell (or the partial one) written before stays as it was.
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.isdir(old) and not os.path.exists(out):
            with contextlib.suppress(OSError):
                os.replace(old, out)
        where = exc.filename or out
        raise StoreError(f"could not write {where}: {exc.strerror or exc}") from None


def _write_cell(out, tmp, old, result, csv):
    os.makedirs(os.path.dirname(os.path.abspath(out)) or ".", exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    result.requests.to_parquet(os.path.join(tmp, schema.REQUESTS), index=False)
    result.trials.to_parquet(os.path.join(tmp, schema.TRIALS), index=False)
    if result.threads is not None and len(result.threads):
        result.threads.to_parquet(os.path.join(tmp, schema.THREADS), index=False)
    if csv:
        for table, name in schema.CSV_TABLES.items():
            getattr(result, table).to_csv(os.path.join(tmp, name), index=False)
    # The manifest says how many trials are valid: a cell with none is not finished (is_finished).
    manifest = {**result.manifest, "valid_trials": _valid_trials(result.trials)}
    with open(os.path.join(tmp, schema.MANIFEST), "w") as fh:
        json.dump(manifest, fh, indent=1, default=str)
    # Durable before it counts: every file, then the folder, reach the disk before the rename.
    for name in os.listdir(tmp):
        _fsync(os.path.join(tmp, name))
    _fsync(tmp)
    # The old cell is moved aside, not deleted first: at every moment `out` is a whole cell or absent.
    if os.path.exists(out):
        os.replace(out, old)
    os.replace(tmp, out)
    _fsync(os.path.dirname(os.path.abspath(out)))
    shutil.rmtree(old, ignore_errors=True)
    return out


def write_sweep_file(out, settings):
    """Write ``settings`` (a JSON-able dict) as ``<out>/sweep.json``, atomically and durably.

    Written to a temporary file, flushed to the disk and renamed over the old
    one, as :func:`write_cell` writes a cell: a reader sees the old settings
    or the new ones, never half of them.

    Examples
    --------
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> write_sweep_file(folder, {"trials": 3}) == os.path.join(folder, SWEEP_FILE)
    True
    >>> read_sweep_file(folder)
    {'trials': 3}
    """
    os.makedirs(out, exist_ok=True)
    return write_json(os.path.join(out, SWEEP_FILE), settings, default=str)


def write_json(path, data, **options):
    """Write ``data`` as JSON to ``path`` whole or not at all, and durably; return ``path``.

    A temporary file in the same folder is flushed to the disk and renamed
    over ``path``, then the folder's entries are flushed: a reader sees the
    old file or the new one, and a crash leaves no half of either.
    ``options`` go to :func:`json.dump` (``default=str``, ``allow_nan=False``...).

    Examples
    --------
    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "x.json")
    >>> write_json(path, {"a": 1}) == path, json.load(open(path))
    (True, {'a': 1})
    """
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1, **options)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync(os.path.dirname(os.path.abspath(path)))
    return path


def read_sweep_file(out):
    """The settings in ``<out>/sweep.json``; None when there is none (a new folder, or an older sweep).

    Raises :class:`~tuna_lab.errors.ExperimentError` when the file is there but unreadable.

    Examples
    --------
    >>> read_sweep_file("/nonexistent") is None
    True
    """
    path = os.path.join(out, SWEEP_FILE)
    try:
        with open(path) as fh:
            settings = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ExperimentError(f"{path} is not readable ({type(exc).__name__}): delete it to resume the sweep "
                              "with the settings given now") from None
    if not isinstance(settings, dict):
        raise ExperimentError(f"{path} does not hold a sweep's settings: delete it to resume the sweep")
    return settings


def _valid_trials(trials):
    if not len(trials):
        return 0
    if "trial_status" not in trials.columns:
        return int(len(trials))
    return int(trials["trial_status"].eq("ok").sum())


def _fsync(path):
    """Flush ``path`` (a file or a folder's entries) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def machine_name(info):
    """The name of the machine a manifest (or a worker's description) comes from: hostname and fingerprint.

    A cluster sweep writes each machine's cells under this folder name; two
    machines with one hostname but different CPUs (or two CPU sets of one
    host) get different names. ``"unknown"`` when ``info`` lacks either
    (cells measured before manifests recorded them).

    Examples
    --------
    >>> machine_name({"hostname": "node7", "fingerprint": "3fb3535c90a1d2e4"})
    'node7-3fb3535c'
    >>> machine_name({})
    'unknown'
    """
    host, fp = info.get("hostname"), info.get("fingerprint")
    return f"{host}-{fp[:8]}" if host and fp else "unknown"


def _cell_folders(path):
    """The sub-folders of ``path`` that may be cells or machines: no temporary or partial ones."""
    return [os.path.join(path, d) for d in os.listdir(path)
            if os.path.isdir(os.path.join(path, d)) and ".tmp-" not in d and ".old-" not in d
            and not d.endswith(schema.PARTIAL_SUFFIX)]


def is_finished(path):
    """Whether the folder ``path`` holds a finished cell: the one rule every reader and resume applies.

    The manifest is written last (:func:`write_cell`), so a folder without it
    is an unfinished cell, which a sweep redoes and a reader skips. A cell
    whose manifest counts no valid trial (``valid_trials``: every trial
    failed, for example every request refused) is not finished either: a
    resume redoes it. Cells written before that count was kept are finished,
    and so is a cell whose manifest cannot be read: the readers report it
    (one clear error) instead of passing over it in silence.

    Examples
    --------
    >>> is_finished("/nonexistent/w2-t2-small-b100")
    False
    """
    try:
        with open(os.path.join(path, schema.MANIFEST)) as fh:
            manifest = json.load(fh)
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True            # there, but unreadable: the readers say so, loudly, rather than skip it
    return not isinstance(manifest, dict) or manifest.get("valid_trials", 1) > 0


def finished_keys(folder):
    """The names of the finished cells directly inside ``folder`` (empty if it does not exist).

    Examples
    --------
    >>> finished_keys("/nonexistent")
    set()
    """
    if not os.path.isdir(folder):
        return set()
    return {key for key in os.listdir(folder) if is_finished(os.path.join(folder, key))}


def finished_cells(path):
    """The finished cells under ``path`` as sorted ``(folder, machine)`` pairs.

    Raises :class:`~tuna_lab.errors.ExperimentError` when ``path`` is no
    folder or holds no finished cell.

    ``path`` is a cell, a sweep (cells inside; machine None) or a cluster
    sweep (machine folders with cells inside; machine: the folder's name).
    """
    if not os.path.isdir(path):
        raise ExperimentError(f"no results folder at {path}")
    if is_finished(path):
        return [(path, None)]
    cells = []
    for folder in sorted(_cell_folders(path)):
        if is_finished(folder):
            cells.append((folder, None))
        else:
            cells += [(cell, os.path.basename(folder)) for cell in sorted(_cell_folders(folder)) if is_finished(cell)]
    if not cells:
        raise ExperimentError(f"no finished tuna-lab results under {path}")
    return cells


def load_results(path):
    """Read every finished cell under ``path`` -> ``(requests, trials, manifests)``.

    ``path`` is a cell folder, a sweep, or a cluster sweep (``<path>/<machine>/<cell>``,
    see :func:`tuna_lab.measure.cluster.sweep_on`). The results of a cluster sweep
    have a ``machine`` column in both tables (and a ``"machine"`` key in each
    manifest): the machine is a factor of the analysis. A sweep on one machine
    has no such column.

    Examples
    --------
    >>> requests, trials, manifests = load_results("notebooks/data/sweep-2cpu")
    >>> trials.groupby("policy")["p99"].mean().index.tolist()
    ['cfs', 'round-robin', 'tuna-scatter']
    >>> # skipped: needs a sweep on a cluster (a machine column)
    >>> trials.groupby(["machine", "policy"])["p99"].mean()             # doctest: +SKIP
    """
    cells = finished_cells(path)
    # Cells found one level deeper (a cluster sweep): every row says which machine it comes from.
    by_machine = any(machine is not None for _, machine in cells)
    reqs, trials, manifests = [], [], []
    for cell, machine in cells:
        try:
            with open(os.path.join(cell, schema.MANIFEST)) as fh:
                meta = json.load(fh)
            table = pd.read_parquet(os.path.join(cell, schema.TRIALS))
            file = os.path.join(cell, schema.REQUESTS)
            rows = pd.read_parquet(file) if os.path.exists(file) and os.path.getsize(file) else None
        except Exception as exc:  # pyarrow and json raise many types for a damaged file
            raise ExperimentError(f"{cell} is not a readable tuna-lab result ({type(exc).__name__}); "
                                  "delete it to have a sweep redo it") from None
        if by_machine:
            machine = machine or machine_name(meta)
            meta = {**meta, "machine": machine}
            table = table.assign(machine=machine)
            rows = None if rows is None else rows.assign(machine=machine)
        manifests.append(meta)
        trials.append(table)
        if rows is not None:
            reqs.append(rows)
    return _concat(reqs), _concat(trials), manifests


def load_thread_cpu(path):
    """Per-thread CPU accounting of every finished cell under ``path`` (empty frame if none was recorded).

    One row per (cell, policy, trial, worker, role): ``threads``, ``cpu_seconds``,
    ``max_thread_cpu_seconds``, ``busy_cpu_seconds``, ``idle_cpu_seconds``, ``requests``,
    ``wall_seconds``, ``numa_node``, ``numa_locality`` (see :func:`tuna_lab.measure.cpu.account`),
    ``cpus`` (the cpulist its threads were allowed on at the end of the load; absent in older results);
    and ``machine`` for a cluster sweep, as in :func:`load_results`.
    """
    cells = finished_cells(path)
    by_machine = any(machine is not None for _, machine in cells)
    frames = []
    for cell, machine in cells:
        file = os.path.join(cell, schema.THREADS)
        if os.path.exists(file):
            try:
                frame = pd.read_parquet(file)
                if by_machine:
                    with open(os.path.join(cell, schema.MANIFEST)) as fh:
                        frame = frame.assign(machine=machine or machine_name(json.load(fh)))
            except Exception as exc:  # pyarrow raises many types for a damaged file
                raise ExperimentError(f"{file} is not readable ({type(exc).__name__})") from None
            frames.append(frame)
    return _concat(frames)
