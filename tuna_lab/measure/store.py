"""The result store: writing a cell, the one rule of a finished cell, and reading results back.

A cell is a folder of the files :mod:`tuna_lab.measure.schema` names; it is
written whole into a temporary folder and renamed in (:func:`write_cell`),
with the manifest last, so that :func:`cell_state` - the only test of "is
this cell done?" that a resume and a cluster sweep use (:func:`is_finished`),
and of "may it be read?" that a reader uses - never sees half a cell. A cell
is finished when every policy it promised has its valid trials (a trial is
valid when ``ok`` and no worker was replaced nor the master restarted
during it: :func:`valid_rows`); :func:`no_valid_trial` names the policies
that have none. :func:`load_results` and :func:`load_thread_cpu` read a cell, a
sweep (``<path>/<cell>``) or a cluster sweep (``<path>/<machine>/<cell>``):
every cell with a valid trial, and a corrupt manifest is refused with one line.

Examples
--------
>>> from tuna_lab.measure.store import load_results
>>> requests, trials, manifests = load_results("notebooks/data/sweep-2cpu")   # the sweep notebook 08 reads
>>> len(manifests), sorted(trials["policy"].unique())
(10, ['cfs', 'round-robin', 'tuna-scatter'])
"""

import contextlib
import os
import shutil
import stat
from dataclasses import dataclass, field

import pandas as pd

# Re-exported: manifests, sweep.json and tune.json are written whole or not at all, never through a link.
from .. import _files
from .._checks import printable
from .._files import read_json, write_json
from ..errors import ExperimentError, StoreError, UnreadableCellsError
from . import schema
from .folder_lock import LOCK_NAME, held_here, lock_folder
from .readable import read_table

__all__ = ["check_out", "lock_folder", "write_cell", "is_finished", "cell_state", "CellState", "valid_by_policy",
           "valid_rows", "no_valid_trial", "passed_over", "finished_keys", "finished_cells", "load_results",
           "load_thread_cpu", "load_cells", "held_here", "LOCK_NAME",
           "machine_name", "SWEEP_FILE", "write_sweep_file", "read_sweep_file", "read_manifest", "write_json"]

#: The name of a sweep's settings file, written in its folder before the first cell.
SWEEP_FILE = "sweep.json"


def _concat(frames):
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _with_columns(frame, columns):
    """``frame`` with every one of ``columns`` (NaN where a table written before them lacks it)."""
    missing = [c for c in columns if c not in frame.columns]
    return frame.assign(**dict.fromkeys(missing, float("nan"))) if missing else frame


def check_out(out, what="out"):
    """Refuse (:class:`ExperimentError`) a results folder that could not be written, before anything runs.

    ``out`` must be a folder or not exist yet; then the nearest folder that
    exists above it must be writable. Measuring first and failing to write
    afterwards would lose every trial. Its whole path must pass
    :func:`tuna_lab._files.check_path`: everything of a measurement is
    written in it under names anyone can predict, so a link another user
    could have planted on the way (``theirs/out -> /root/secret``), or a
    folder on the way they own or may write, is refused.

    Examples
    --------
    >>> check_out("/proc/version")
    Traceback (most recent call last):
    ...
    tuna_lab.errors.ExperimentError: out /proc/version is a file, not a folder
    """
    real, st = _files.check_path(out, what, ExperimentError)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise ExperimentError(f"{what} {out} is a file, not a folder")
    parent = real
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ExperimentError(f"{what} {out}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ExperimentError(f"{what} {out}: {parent} is not writable")
    return out


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
        The cell could not be written (a full disk, no permission, a value
        a table cannot hold); an existing ``out`` is left as it was, and no
        temporary folder is left, whatever the error (Ctrl-C too, which is
        re-raised).

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
    except BaseException as exc:
        # A full disk, a lost permission, a value pyarrow cannot store, Ctrl-C: the cell (or the partial
        # one) written before stays as it was, and nothing of this attempt is left.
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.isdir(old) and not os.path.exists(out):
            with contextlib.suppress(OSError):
                os.replace(old, out)
        if isinstance(exc, OSError):
            where = getattr(exc, "filename", None) or out
            raise StoreError(f"could not write {where}: {exc.strerror or exc}") from None
        if isinstance(exc, Exception):
            text = str(exc).splitlines()[0][:200] if str(exc) else ""
            raise StoreError(f"could not write {out}: {type(exc).__name__}: {text}") from None
        raise


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
    # The manifest says how many trials are valid, in all and per policy: what is_finished reads.
    valid = valid_by_policy(result.trials, result.manifest.get("policies") or ())
    manifest = {**result.manifest, "valid_trials": sum(valid.values()), "valid_by_policy": valid}
    write_json(os.path.join(tmp, schema.MANIFEST), manifest, durable=False, error=StoreError, default=str)
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
        settings = read_json(path, follow=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ExperimentError(f"{exc}: delete {path} to resume the sweep with the settings given now") from None
    if not isinstance(settings, dict):
        raise ExperimentError(f"{path} does not hold a sweep's settings: delete it to resume the sweep")
    return settings


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
    """The sub-folders of ``path`` that may be cells or machines, and its links to folders; no partial ones.

    A link to a folder is listed, never read through: the readers name it as a cell they refuse
    (:func:`_state`), for another user may have planted it in a shared results folder. (Whether it
    points to a folder is a ``stat``, which opens nothing.)
    """
    try:
        with os.scandir(path) as entries:
            found = [e for e in entries if e.is_dir(follow_symlinks=False) or (e.is_symlink() and e.is_dir())]
    except OSError as exc:
        raise ExperimentError(f"cannot read the results folder {path}: {exc.strerror or exc}") from None
    return [e.path for e in found if ".tmp-" not in e.name and ".old-" not in e.name
            and not e.name.endswith(schema.PARTIAL_SUFFIX)]


def _int(value, least=0):
    """``value`` if it is an int (not a bool) of at least ``least``, else None: a manifest's counts."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= least else None


def valid_rows(trials):
    """Which rows of a trials table are valid trials: the one definition every command and reader uses.

    A trial is valid when its ``trial_status`` is ``"ok"``, no worker was
    replaced nor the master restarted during it
    (:data:`~tuna_lab.measure.schema.FAULT_COLUMNS`), it has a ``p99``, and
    every worker did a fair part of its load: ``worker_share`` at least
    :func:`~tuna_lab.measure.schema.fair_share` of the busiest worker's
    (:data:`~tuna_lab.measure.schema.BALANCE_COLUMNS`). A column a table
    lacks (written before it, or made by hand), and a missing value in it,
    does not count against a row: its other columns judge it.

    Examples
    --------
    >>> import pandas as pd
    >>> valid_rows(pd.DataFrame({"trial_status": ["ok", "ok", "failed"], "workers_replaced": [0, 1, 0]})).tolist()
    [True, False, False]
    >>> valid_rows(pd.DataFrame({"trial_status": "ok", "p99": [0.02, None, 0.02, 0.02],
    ...                          "worker_share": [1.0, 1.0, 0.01, float("nan")]})).tolist()
    [True, False, False, True]
    """
    if not len(trials):
        return pd.Series([], dtype=bool)
    ok = pd.Series(True, trials.index)
    if "trial_status" in trials.columns:
        ok &= trials["trial_status"].fillna("ok").eq("ok")
    for column in schema.FAULT_COLUMNS:
        if column in trials.columns:
            ok &= pd.to_numeric(trials[column], errors="coerce").fillna(0).eq(0)
    if "p99" in trials.columns:
        ok &= pd.to_numeric(trials["p99"], errors="coerce").notna()
    if "worker_share" in trials.columns:
        share = pd.to_numeric(trials["worker_share"], errors="coerce")
        ok &= share.isna() | share.ge(schema.fair_share())
    return ok


def valid_by_policy(trials, policies=()):
    """``{policy: valid trials}`` of a trials table, every one of ``policies`` included (0 when it has none).

    Valid as :func:`valid_rows` says.

    Examples
    --------
    >>> t = pd.DataFrame({"policy": ["cfs", "cfs", "round-robin"], "trial_status": ["ok", "failed", "ok"],
    ...                   "workers_replaced": [0, 0, 1], "master_restarted": 0})
    >>> valid_by_policy(t, ["cfs", "round-robin", "tuna-scatter"])
    {'cfs': 1, 'round-robin': 0, 'tuna-scatter': 0}
    """
    counts = dict.fromkeys(policies, 0)
    if len(trials) and "policy" in trials.columns:
        for policy, n in trials.loc[valid_rows(trials), "policy"].value_counts(sort=False).items():
            counts[str(policy)] = counts.get(str(policy), 0) + int(n)
    return counts


def read_manifest(cell):
    """The manifest of the cell folder ``cell`` as a dict; :class:`ExperimentError` (one line) if it is unsound.

    Read as :func:`tuna_lab._files.read_json` reads (a regular file, not a
    link, bounded in size and nesting); a manifest that is no JSON object, or
    whose counts (``trials``, ``valid_trials``, ``valid_by_policy``) are not
    counts, is refused. ``FileNotFoundError`` when there is none.
    """
    path = os.path.join(cell, schema.MANIFEST)
    try:
        manifest = read_json(path, follow=False)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no manifest (an unfinished cell)") from None
    except OSError as exc:
        raise ExperimentError(f"{cell} is not a readable tuna-lab result ({exc}); a sweep's resume redoes it, "
                              "or delete it") from None
    why = _unsound(manifest)
    if why:
        raise ExperimentError(f"{cell} is not a readable tuna-lab result ({path}: {why}); a sweep's resume redoes "
                              "it, or delete it")
    return manifest


def _unsound(manifest):
    """What is wrong with a parsed manifest, in words (None when nothing is)."""
    if not isinstance(manifest, dict):
        return f"holds a JSON {type(manifest).__name__}, not an object"
    if "valid_trials" in manifest and _int(manifest["valid_trials"]) is None:
        return f"valid_trials is {manifest['valid_trials']!r}, not a count"
    if "trials" in manifest and _int(manifest["trials"], 1) is None:
        return f"trials is {manifest['trials']!r}, not a positive count"
    policies = manifest.get("policies")
    if policies is not None and not (isinstance(policies, list) and all(isinstance(p, str) for p in policies)):
        return "policies is not a list of names"
    valid = manifest.get("valid_by_policy")
    if valid is not None and not (isinstance(valid, dict) and all(_int(v) is not None for v in valid.values())):
        return "valid_by_policy is not a count per policy"
    return None


@dataclass(frozen=True)
class CellState:
    """What a cell folder holds, as far as a resume and a reader care: :func:`cell_state` makes it.

    Attributes
    ----------
    path : str
    status : str
        ``"finished"``: every promised policy has its valid trials;
        ``"incomplete"``: a sound manifest, but some policy is short of them;
        ``"missing"``: no manifest (an unfinished or interrupted cell);
        ``"corrupt"``: a manifest that cannot be read or is not sound.
    reason : str
        Why it is not finished, in one line (``""`` when it is).
    trials : int or None
        Valid trials promised per policy (None for a cell that does not say).
    valid : dict
        ``{policy: valid trials}`` for every promised policy.
    """

    path: str
    status: str
    reason: str = ""
    trials: int | None = None
    valid: dict = field(default_factory=dict)

    @property
    def finished(self):
        return self.status == "finished"

    @property
    def missing(self):
        """``{policy: valid trials still missing}``, for the policies short of ``trials``."""
        if self.trials is None:
            return {}
        return {p: self.trials - n for p, n in self.valid.items() if n < self.trials}

    @property
    def without_valid(self):
        """The promised policies with no valid trial at all, in the manifest's order."""
        return [p for p, n in self.valid.items() if n == 0]

    @property
    def readable(self):
        """Whether readers take it: a sound manifest and at least one valid trial (or an older cell)."""
        return self.status == "finished" or (self.status == "incomplete" and any(self.valid.values()))


def cell_state(path):
    """The :class:`CellState` of the cell folder ``path``: the one rule of "finished" every resume applies.

    The manifest is written last (:func:`write_cell`), so a folder without
    it is an unfinished cell. A cell written by
    :func:`~tuna_lab.measure.experiment.run` promises ``trials`` valid trials
    of every one of its ``policies``; its manifest counts them
    (``valid_by_policy``), and it is finished only when every policy has
    them all - a resume redoes what is missing, and only that. A cell whose
    manifest does not promise that (written by an older version) is finished
    when it has a valid trial at all (``valid_trials``; a cell without
    even that count, older still, is finished). A manifest that cannot be
    read, or whose counts are not counts (``"abc"``, null), makes the cell
    ``corrupt``: not finished (a resume redoes it and says so), and the
    readers refuse it with one line rather than pass over it.

    Examples
    --------
    >>> cell_state("/nonexistent/w2-t2-small-b100").status
    'missing'
    """
    try:
        manifest = read_manifest(path)
    except FileNotFoundError:
        return CellState(path, "missing", "no manifest.json (an unfinished cell)")
    except ExperimentError as exc:
        return CellState(path, "corrupt", str(exc))
    promised, trials = manifest.get("policies"), manifest.get("trials")
    by_policy = manifest.get("valid_by_policy")
    if by_policy is None and promised is not None and trials is not None:
        # Written before the counts per policy were: counted from its trials, as write_cell counts them.
        # Looked at first: a FIFO would block the read, and a folder reads as an empty table (no valid trial).
        table, why = read_table(os.path.join(path, schema.TRIALS), "trials")
        if why:
            return CellState(path, "corrupt", f"{path}: its trials cannot be read ({why})")
        by_policy = valid_by_policy(table, promised)
    if by_policy is None or promised is None or trials is None:
        valid = manifest.get("valid_trials", 1)
        if valid > 0:
            return CellState(path, "finished")
        return CellState(path, "incomplete", "no valid trial", valid=dict.fromkeys(promised or (), 0))
    valid = {p: int(by_policy.get(p, 0)) for p in promised}
    short = [f"{p} has {n} of its {trials} valid trials" for p, n in valid.items() if n < trials]
    return CellState(path, "incomplete" if short else "finished", "; ".join(short), trials, valid)


def is_finished(path):
    """Whether the folder ``path`` holds a finished cell (:func:`cell_state`): what a resume skips.

    Examples
    --------
    >>> is_finished("/nonexistent/w2-t2-small-b100")
    False
    """
    return cell_state(path).finished


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


def _is_cell(folder):
    """Whether ``folder`` is a cell (it has a manifest, sound or not) rather than a sweep or a machine's folder."""
    return os.path.lexists(os.path.join(folder, schema.MANIFEST))


def _cells_under(path):
    """Every cell folder under ``path`` (a cell, a sweep, a cluster sweep), sorted, with its machine (or None)."""
    if _is_cell(path):
        return [(path, None)]
    cells = []
    for folder in sorted(_cell_folders(path)):
        if os.path.islink(folder) or _is_cell(folder):
            cells.append((folder, None))
        else:
            cells += [(cell, os.path.basename(folder)) for cell in sorted(_cell_folders(folder))
                      if os.path.islink(cell) or _is_cell(cell)]
    return cells


def _state(cell, path):
    """:func:`cell_state` of a cell found under ``path``; one reached by a link there is refused, not read."""
    if cell != path and os.path.islink(cell):
        return CellState(cell, "corrupt", f"{cell} is a link: results are not read through a link, which "
                                          "another user may have planted; copy the cell here to read it")
    return cell_state(cell)


def finished_cells(path, skip_unreadable=False, left_out=None):
    """The cells under ``path`` that readers read, as sorted ``(folder, machine)`` pairs.

    A reader reads every cell with a valid trial: a finished one, and one a
    resume would complete (its valid trials are measurements all the same;
    a policy short of trials just has fewer). A cell with no valid trial
    is passed over; a corrupt one is named, never passed over in silence
    (:func:`cell_state`).

    Raises :class:`~tuna_lab.errors.ExperimentError` when ``path`` is no
    folder or holds no cell to read, and
    :class:`~tuna_lab.errors.UnreadableCellsError` (one line naming each)
    when some cell's manifest is unsound, unless ``skip_unreadable``: then
    those cells are left out and added to ``left_out`` (a dict, ``{cell: why}``).

    ``path`` is a cell, a sweep (cells inside; machine None) or a cluster
    sweep (machine folders with cells inside; machine: the folder's name).
    """
    if not os.path.isdir(path):
        raise ExperimentError(f"no results folder at {path}")
    cells, bad = [], {}
    for cell, machine in _cells_under(path):
        state = _state(cell, path)
        if state.status == "corrupt":
            bad[cell] = state.reason
        elif state.readable:
            cells.append((cell, machine))
    _unreadable(path, bad, skip_unreadable, left_out, none_left=not cells)
    if not cells:
        raise ExperimentError(f"no finished tuna-lab results under {path}")
    return cells


def _unreadable(path, bad, skip, left_out, none_left=False):
    """Name the cells ``bad`` (``{cell: why}``): raise :class:`UnreadableCellsError`, or (``skip``) keep them.

    Raised even with ``skip`` when ``none_left``: there is nothing else to read.
    """
    if not bad:
        return
    if left_out is not None:
        left_out.update(bad)
    if not skip or none_left:
        # Folder names and reasons are another user's to write: nothing a terminal would act on is printed.
        names = {printable(os.path.relpath(c, path) if c != path else c, 200): printable(why)
                 for c, why in bad.items()}
        if len(names) == 1:
            (name, why), = names.items()
            raise UnreadableCellsError(f"{name} under {path} is not a readable tuna-lab result ({why}), and "
                                       "leaving it out would change every average", bad)
        listed = "; ".join(f"{name} ({why})" for name, why in names.items())
        raise UnreadableCellsError(f"{len(names)} cells under {path} are not readable tuna-lab results, and "
                                   f"leaving them out would change every average: {listed}", bad)


def no_valid_trial(source, keys=None):
    """The promised policies without a single valid trial: ``{cell: [policy, ...]}``, only cells that have some.

    What a command needs to say "no trial of some policy succeeded" (and exit
    non-zero): empty when every policy of every cell has a valid trial.

    Parameters
    ----------
    source : Result or str
        A :class:`~tuna_lab.measure.experiment.Result` (its ``trials`` against
        its manifest's ``policies``; the key is the manifest's ``cell``), or a
        results folder - a cell, a sweep or a cluster sweep - whose every cell
        with a manifest is counted, whether finished or not (``.partial``
        folders are not cells).
    keys : collection of str, optional
        With a folder: count only the cells of these names (a sweep's own,
        not other cells that share its folder).

    Raises
    ------
    ExperimentError
        A folder that is none, or holds a cell whose manifest is unsound (one line).

    Examples
    --------
    >>> from tuna_lab.measure.experiment import Result
    >>> t = pd.DataFrame({"policy": ["cfs", "tuna-scatter"], "trial_status": ["ok", "failed"]})
    >>> no_valid_trial(Result(pd.DataFrame(), t, {"cell": "w2-t1-small-b10", "policies": ["cfs", "tuna-scatter"]}))
    {'w2-t1-small-b10': ['tuna-scatter']}
    """
    if not isinstance(source, (str, os.PathLike)):
        manifest = source.manifest or {}
        valid = valid_by_policy(source.trials, manifest.get("policies") or ())
        lacking = [p for p, n in valid.items() if n == 0]
        return {manifest.get("cell") or source.path or "": lacking} if lacking else {}
    path = os.fspath(source)
    if not os.path.isdir(path):
        raise ExperimentError(f"no results folder at {path}")
    out = {}
    for cell, _ in _cells_under(path):
        if keys is not None and os.path.basename(os.path.normpath(cell)) not in keys:
            continue
        state = _state(cell, path)
        if state.status == "corrupt":
            raise ExperimentError(state.reason)
        if state.without_valid:
            out[cell] = state.without_valid
    return out


def passed_over(path):
    """The cells under the folder ``path`` that readers pass over: a sound manifest, not one valid trial.

    :func:`finished_cells` reads none of them; ``report`` names each, so that none is dropped in silence.
    """
    states = [_state(cell, path) for cell, _ in _cells_under(path)]
    return [s.path for s in states if s.status == "incomplete" and not s.readable]


def load_results(path, skip_unreadable=False, left_out=None):
    """Every cell under ``path`` that has a valid trial (:func:`finished_cells`) -> ``(requests, trials, manifests)``.

    ``path`` is a cell folder, a sweep, or a cluster sweep (``<path>/<machine>/<cell>``,
    see :func:`tuna_lab.measure.sweeps.cluster.sweep_on`). The results of a cluster sweep
    have a ``machine`` column in both tables (and a ``"machine"`` key in each
    manifest): the machine is a factor of the analysis. A sweep on one machine
    has no such column.

    Every cell's tables are checked before they are read
    (:mod:`tuna_lab.measure.readable`: regular files that parse, their
    columns of the documented types). A cell that fails is never left out
    in silence: :class:`~tuna_lab.errors.UnreadableCellsError` names every
    one, unless ``skip_unreadable``, which reads the others and adds those
    to ``left_out`` (a dict, ``{cell: why}``).

    Examples
    --------
    >>> requests, trials, manifests = load_results("notebooks/data/sweep-2cpu")
    >>> trials.groupby("policy")["p99"].mean().index.tolist()
    ['cfs', 'round-robin', 'tuna-scatter']
    >>> # skipped: needs a sweep on a cluster (a machine column)
    >>> trials.groupby(["machine", "policy"])["p99"].mean()             # doctest: +SKIP
    """
    reqs, trials, manifests, _ = _load_cells(path, skip_unreadable, left_out)
    return reqs, trials, manifests


def _load_cells(path, skip_unreadable=False, left_out=None):
    """``(requests, trials, manifests, threads)`` of the cells under ``path``: :func:`load_results`' reading."""
    from .cpu import thread_role

    found = {}
    try:
        cells = finished_cells(path, True, found)
    except UnreadableCellsError:
        cells = []                           # every cell unsound: named below with the rest
    # Cells found one level deeper (a cluster sweep): every row says which machine it comes from.
    by_machine = any(machine is not None for _, machine in cells)
    reqs, trials, manifests, threads = [], [], [], []
    for cell, machine in cells:
        try:
            meta = read_manifest(cell)
        except (OSError, ExperimentError) as exc:       # replaced since it was looked at
            found[cell] = str(exc)
            continue
        tables = {}
        for name, table, required in ((schema.TRIALS, "trials", True), (schema.REQUESTS, "requests", True),
                                      (schema.THREADS, "threads", False)):
            tables[table], why = read_table(os.path.join(cell, name), table, required)
            if why:
                found[cell] = why
                break
        if cell in found:
            continue
        if not len(tables["trials"]):
            found[cell] = f"{schema.TRIALS} has no rows"
            continue
        table = _with_columns(tables["trials"], schema.EVIDENCE_COLUMNS)
        rows, cpu = tables["requests"], tables["threads"]
        if cpu is not None:
            cpu = _with_columns(cpu, schema.THREAD_EVIDENCE_COLUMNS)
            if "role" in cpu.columns:
                cpu["role"] = cpu["role"].map(thread_role)
        if by_machine:
            machine = machine or machine_name(meta)
            meta = {**meta, "machine": machine}
            table, rows = table.assign(machine=machine), rows.assign(machine=machine)
            cpu = None if cpu is None else cpu.assign(machine=machine)
        manifests.append(meta)
        trials.append(table)
        if len(rows):
            reqs.append(rows)
        if cpu is not None:
            threads.append(cpu)
    _unreadable(path, found, skip_unreadable, left_out, none_left=not manifests)
    if not manifests:
        raise ExperimentError(f"no finished tuna-lab results under {path}")
    return _concat(reqs), _concat(trials), manifests, _concat(threads)


def load_thread_cpu(path, skip_unreadable=False, left_out=None):
    """Per-thread CPU accounting of every cell under ``path`` that readers read (empty frame if none was recorded).

    One row per (cell, policy, trial, process, role): ``threads``, ``cpu_seconds``,
    ``max_thread_cpu_seconds``, ``busy_cpu_seconds``, ``idle_cpu_seconds``, ``requests``,
    ``wall_seconds``, ``numa_node``, ``numa_locality`` (see :func:`tuna_lab.measure.cpu.account`),
    ``cpus`` (the cpulist its threads were allowed on over the load; absent in older results),
    the :data:`~tuna_lab.measure.schema.THREAD_EVIDENCE_COLUMNS` (NaN in older results);
    and ``machine`` for a cluster sweep, as in :func:`load_results`. ``role`` is one of
    :data:`tuna_lab.measure.cpu.ROLES`: older results' ``"openmp"`` is read as ``"pool"``.
    The cells read, and those that cannot be, are :func:`load_results`' own.
    """
    return _load_cells(path, skip_unreadable, left_out)[3]


def load_cells(path, skip_unreadable=False):
    """``(requests, trials, manifests, threads, left_out)``: :func:`load_results` and :func:`load_thread_cpu` at once.

    ``left_out`` is ``{cell: why}`` of the cells ``skip_unreadable`` left out (empty without it).
    """
    left_out = {}
    return (*_load_cells(path, skip_unreadable, left_out), left_out)
