"""Whose folder is it: what ``run``, ``tune`` and ``sweep`` check before they measure anything.

Two commands writing one folder replace each other's results without a word:
``run --out SWEEP/<cell>`` while the sweep runs, or ``tune --out SWEEP``
after it, lost the sweep's cells, and the sweep then counted the intruder's
cell as its own and never redid it. So a folder is *claimed* by the sweep (or
tune) whose settings file (:data:`~tuna_lab.measure.store.SWEEP_FILE`) it
holds, and by every cell and measurement above it:

* a folder that lies inside a sweep's or tune's folder, or inside a cell, is
  refused (:func:`check_claim`);
* a folder that holds a sweep is refused to ``run`` unless the run is one of
  that sweep's cells with its settings (the same experiment, resuming), and
  to ``tune`` unless it holds a tune with the same settings; a ``tune`` is
  refused a folder holding cells of another command;
* a folder above that a live measurement holds (its lock) is refused too.

And a cell's name is checked against the file system's limits before
anything runs (:func:`check_cell_name`): a ``--label`` of 300 characters
once measured everything and then failed with "File name too long".

Examples
--------
>>> check_cell_name("/tmp/" + "w1-t1-" + "x" * 300)
Traceback (most recent call last):
...
tuna_lab.errors.ExperimentError: the cell folder name w1-t1-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx... is 306 bytes, and the file system allows 255 in a name (with the 20 bytes of its .partial.tmp-PID folder, 326): give a shorter label
"""

import fcntl
import os

from ..errors import ExperimentError
from . import schema
from .store import LOCK_NAME, SWEEP_FILE, held_here, is_finished, read_sweep_file

__all__ = ["check_cell_name", "check_claim", "TUNE_KIND"]

#: ``kind`` of the settings file a tune writes in its folder (a sweep's has none, or ``"sweep"``).
TUNE_KIND = "tune"
# What write_cell puts beside a cell while writing it: <cell>.partial.tmp-<pid> (a pid has at most 7 digits).
_BESIDE = schema.PARTIAL_SUFFIX + ".tmp-" + "0" * 7
# The longest name written inside a cell folder, and the temporary names _files gives while writing it.
_INSIDE = max(len(n) for n in (schema.MANIFEST, schema.REQUESTS, schema.TRIALS, schema.THREADS, LOCK_NAME,
                                *schema.CSV_TABLES.values())) + 16


def _limit(folder, name, default):
    try:
        return os.pathconf(folder, name)
    except (OSError, ValueError):
        return default


def check_cell_name(out, error=ExperimentError):
    """Refuse (``error``, one line) a cell folder ``out`` whose name or path the file system cannot hold.

    Checked against ``NAME_MAX`` and ``PATH_MAX`` of the nearest folder that
    exists on the way (``os.pathconf``), with what is written beside the cell
    (its ``.partial`` and temporary folders) and inside it: before any
    server starts, not once every trial is measured.
    """
    path = os.path.abspath(os.fspath(out)).rstrip("/")
    name = os.path.basename(path)
    parent = os.path.dirname(path)
    while parent != os.path.dirname(parent) and not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    name_max = _limit(parent, "PC_NAME_MAX", 255)
    path_max = _limit(parent, "PC_PATH_MAX", 4096)
    size = len(os.fsencode(name))
    if size + len(_BESIDE) > name_max:
        shown = name if len(name) <= 40 else name[:40] + "..."
        raise error(f"the cell folder name {shown} is {size} bytes, and the file system allows {name_max} in a "
                    f"name (with the {len(_BESIDE)} bytes of its .partial.tmp-PID folder, {size + len(_BESIDE)}): "
                    "give a shorter label")
    for part in os.path.relpath(path, parent).split(os.sep)[:-1]:
        if len(os.fsencode(part)) > name_max:
            raise error(f"the folder name {part[:40]}... on the way to {path[:60]}... is longer than the "
                        f"{name_max} bytes the file system allows in a name")
    total = len(os.fsencode(path)) + len(_BESIDE) + 1 + _INSIDE
    if total >= path_max:
        raise error(f"the cell folder {path[:60]}... makes paths of {total} bytes, and the file system allows "
                    f"{path_max - 1} (PATH_MAX): give a shorter --out or label")


def _ancestors(folder):
    """``folder`` (absolute, links resolved) and every folder above it, nearest first."""
    path = os.path.realpath(folder)
    out = [path]
    while os.path.dirname(path) != path:
        path = os.path.dirname(path)
        out.append(path)
    return out


def _held_by_another(folder):
    """Whether a live measurement other than this process's holds the results folder ``folder``."""
    lock = os.path.join(folder, LOCK_NAME)
    if held_here(folder) or not os.path.isfile(lock) or os.path.islink(lock):
        return False
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def check_claim(folder, kind, settings=None, error=ExperimentError):
    """Refuse (``error``, one line) a results folder that another command's results claim.

    Parameters
    ----------
    folder : str
        Where the command writes its cells (``run``: the folder of its cell; ``tune``, ``sweep``: their ``--out``).
    kind : str
        ``"run"``, ``"tune"`` or ``"sweep"``.
    settings : dict, optional
        ``run``: ``cell``, ``policies``, ``trials``, ``requests``, ``seed``, ``concurrency`` (matched
        against a sweep's ``sweep.json``); ``tune``: the tune's settings file (matched as a whole but
        for ``budget``, ``kind`` and ``version``); ``sweep``: ``cells``, the names of its cells (its
        own identity check compares the rest). A folder at a cell's name that holds anything but a
        cell is refused for every kind.
    """
    here = os.path.realpath(folder)
    for above in _ancestors(folder):
        if above != here:
            if os.path.lexists(os.path.join(above, SWEEP_FILE)):
                raise error(f"{folder} lies inside {above}, the folder of a sweep or tune ({SWEEP_FILE}): its "
                            "cells are that sweep's; give a folder outside it")
            if os.path.lexists(os.path.join(above, schema.MANIFEST)):
                raise error(f"{folder} lies inside the results cell {above}; give a folder outside it")
        elif os.path.lexists(os.path.join(above, schema.MANIFEST)):
            raise error(f"{folder} is a results cell: its results are written in a folder of cells, not in a "
                        "cell; give the folder above it, or another")
        if _held_by_another(above):
            raise error(f"{above} is in use by another measurement, which holds every folder inside it; wait "
                        "for it, or give a folder outside it")
    if not os.path.isdir(folder):
        return
    cells = (settings or {}).get("cells") or ([settings["cell"]] if settings and "cell" in settings else [])
    for name in cells:
        # A cell is written whole or not at all (write_cell): a folder at its name without a manifest,
        # holding something, is another measurement's results folder (run --out SWEEP/<cell>), never ours.
        cell = os.path.join(folder, name)
        if os.path.isdir(cell) and not os.path.lexists(os.path.join(cell, schema.MANIFEST)) and os.listdir(cell):
            raise error(f"{cell} holds other results (a results folder, not a cell), and writing the cell "
                        f"{name} would replace them: give another folder")
    if kind == "sweep":
        return
    old = read_sweep_file(folder)
    if kind == "run":
        by = _written_by(os.path.join(folder, (settings or {}).get("cell", "")))
        if old is None and by:
            # An older sweep (no sweep.json) or a tune: its cell says who measured it.
            raise error(f"{os.path.join(folder, settings['cell'])} is a cell measured by `{by}`; a run would "
                        "replace it: give another --out")
        if old is not None:
            why = _run_differs(old, settings or {})
            if why:
                raise error(f"{folder} holds a {old.get('kind') or 'sweep'} ({SWEEP_FILE}) whose cells a run "
                            f"may not replace ({why}): give another --out")
            cell = os.path.join(folder, settings["cell"])
            if is_finished(cell):
                # The same settings resume a cell; a finished one is the sweep's, and a run would replace it.
                raise error(f"{cell} is a finished cell of the sweep in {folder}: a run would replace it; give "
                            "another --out")
        return
    if old is None:
        cells = [d for d in os.listdir(folder) if os.path.lexists(os.path.join(folder, d, schema.MANIFEST))]
        if cells:
            raise error(f"{folder} holds results of another command ({cells[0]}, {len(cells)} cell(s) in all) and "
                        "no tune of its own: give a new --out")
        return
    if old.get("kind") != TUNE_KIND:
        raise error(f"{folder} holds a sweep ({SWEEP_FILE}); a tune may not write its cells there: give a new --out")
    ignored = ("budget", "kind", "version")
    diff = [k for k in sorted(set(old) | set(settings or {}))
            if k not in ignored and old.get(k) != (settings or {}).get(k)]
    if diff:
        raise error(f"{folder} holds a tune with other settings ({', '.join(diff)}): resume it with its own "
                    "settings or give a new --out")


def _written_by(cell):
    """``"sweep"`` or ``"tune"`` when the cell folder ``cell`` was measured by one (its manifest says), else None."""
    from .store import read_manifest

    if not os.path.lexists(os.path.join(cell, schema.MANIFEST)):
        return None
    try:
        manifest = read_manifest(cell)
    except (OSError, ExperimentError):
        return None                    # a corrupt cell: the run's own resume says so and redoes it
    if "tune" in manifest:
        return "tune"
    command = manifest.get("command")
    if isinstance(command, list) and len(command) > 1 and command[1] in ("sweep", "tune"):
        return command[1]
    return None


def _run_differs(old, settings):
    """Why a run with ``settings`` is not a cell of the sweep ``old`` (its ``sweep.json``), in words; "" if it is."""
    if old.get("kind", "sweep") != "sweep":
        return f"it is a {old.get('kind')}'s folder"
    configs = old.get("configs")
    if not isinstance(configs, list) or settings.get("cell") not in configs:
        return f"{settings.get('cell')} is not one of its cells"
    other = [k for k in ("policies", "trials", "requests", "seed", "concurrency") if old.get(k) != settings.get(k)]
    return f"other {', '.join(other)}" if other else ""
