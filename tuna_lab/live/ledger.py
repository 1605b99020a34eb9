"""The record of every CPU mask tuna_lab set on a running server's threads, and the mask each replaced.

``pin --pid`` and ``run --pid`` record here, before binding, the mask each
thread had before tuna_lab first bound it and the mask set
(:func:`record_pins`); ``unpin`` reads it back (:func:`pin_records`).
"""

import os
import tempfile

import psutil

from .. import _files
from ..errors import PinError
from ..machine import procfs
from ..machine.procfs import start_ticks
from .binding import threads_of
from .state import remove_dead_state, started

__all__ = ["PINS_FORMAT", "pin_dir", "pin_records", "record_pins"]

_MASKS_BYTES = 16 << 20

def pin_dir(master):
    """Where ``pin --pid`` keeps, for ``unpin``, the masks it set and those they replaced (``masks.json``).

    Keyed like :func:`hook_dir`, by the user who pins rather than the server's:
    only a folder of theirs that no one else may write is ever read or written.
    """
    return os.path.join(tempfile.gettempdir(), f"tuna_lab-pin-{os.geteuid()}-{int(master)}-{started(master)}")


#: The ``format`` of ``masks.json``: per worker its start time, slot (null: a front process) and threads at the
#: pin; per TID the mask before tuna_lab first bound it and the mask tuna_lab set.
PINS_FORMAT = "tuna_lab.pins/1"


def pin_records(master):
    """What ``pin --pid`` (or ``run --pid``) recorded of its pins of server ``master``; empty when none.

    Returns ``{"workers": {pid: {"started", "slot", "seen"}}, "threads": {tid:
    {"pid", "before", "set"}}}``: per process its start time (clock ticks), its
    slot (None: a process ``--front-cpus`` bound) and the threads it had at the
    pin; per TID the mask before tuna_lab first bound it and the mask tuna_lab
    set. Nothing is read from a folder that is not this user's and private, or
    from a file that is not a record of ours (another format, malformed); a
    master that is gone has none.

    Examples
    --------
    >>> pin_records(os.getpid())
    {'workers': {}, 'threads': {}}
    """
    empty = {"workers": {}, "threads": {}}
    try:
        folder = pin_dir(master)
    except psutil.Error:
        return empty
    if _files.trusted_dir(folder, {os.geteuid()}):
        return empty
    try:
        saved = _files.read_json(os.path.join(folder, "masks.json"), limit=_MASKS_BYTES, follow=False)
        if saved.get("format") != PINS_FORMAT:
            return empty
        workers = {int(pid): {"started": int(w["started"]), "slot": None if w["slot"] is None else int(w["slot"]),
                              "seen": sorted(int(t) for t in w["seen"])} for pid, w in saved["workers"].items()}
        threads = {int(tid): {"pid": int(t["pid"]), "before": sorted(int(c) for c in t["before"]),
                              "set": sorted(int(c) for c in t["set"])} for tid, t in saved["threads"].items()}
    except (OSError, ValueError, TypeError, AttributeError, KeyError):
        return empty
    return {"workers": workers, "threads": threads}


def _write_records(master, records):
    folder = pin_dir(master)
    if not os.path.lexists(folder):
        remove_dead_state("pin", os.geteuid())         # the folders of servers pinned before, now gone
    _files.private_dir(folder, error=PinError)
    data = {"format": PINS_FORMAT,
            "workers": {str(pid): w for pid, w in records["workers"].items()},
            "threads": {str(tid): t for tid, t in records["threads"].items()}}
    _files.write_json(os.path.join(folder, "masks.json"), data, mode=0o600, durable=False, error=PinError)


def record_pins(master, pid, slot, intent, failed=()):
    """Record that tuna_lab sets ``intent`` (``{tid: (mask now, mask to set)}``) on worker ``pid``'s threads.

    ``slot`` None: a process of the front (the master, a helper or front end ``--front-cpus`` binds).

    Written *before* the threads are bound, so that a pin killed half-way can
    still be undone; ``failed`` (TIDs whose binding failed) are dropped
    afterwards. A thread recorded already keeps its first ``before``: the
    mask it had before tuna_lab first touched it. Records of threads that
    ended are dropped.
    """
    records = pin_records(master)
    ticks = start_ticks(pid)
    if ticks is None:
        return
    threads = {tid: t for tid, t in records["threads"].items()
               if procfs.thread_exists(t["pid"], tid) and tid not in failed}
    worker = records["workers"].get(pid)
    if worker is None or worker["started"] != ticks:
        worker = {"started": ticks, "slot": slot, "seen": []}
    worker["slot"] = slot
    worker["seen"] = sorted(set(worker["seen"]) | set(threads_of(pid)))
    for tid, (before, wanted) in intent.items():
        if tid in failed:
            continue
        first = threads.get(tid)
        threads[tid] = {"pid": pid, "before": first["before"] if first else sorted(before), "set": sorted(wanted)}
    workers = {p: w for p, w in records["workers"].items() if start_ticks(p) == w["started"]}
    workers[pid] = worker
    _write_records(master, {"workers": workers, "threads": threads})


