"""The Gunicorn hooks' state folder of a server (:func:`hook_dir`) and its slot records.

The hooks (:mod:`tuna_lab.integrations.gunicorn`) keep, per master, a
folder its master made and marked (:func:`hook_mark`); the workers write
their slot records in its ``records`` subfolder; ``pin --pid`` and
``audit`` read them back (:func:`hooked_workers`, :func:`hook_records`).
"""

import glob
import os
import re
import tempfile

import psutil

from .. import _files
from ..machine import procfs
from ..machine.procfs import remove_dead_folders, start_ticks

__all__ = ["hook_dir", "hook_mark", "hook_records", "hook_dir_problem", "trusted_hook_dir", "write_hook_record",
           "remove_dead_state", "hooked_workers", "started", "HOOK_MARK", "HOOK_RECORDS"]

def hook_dir(master):
    """Where the Gunicorn hooks (:mod:`tuna_lab.integrations.gunicorn`) of server ``master`` keep their state.

    Keyed by the master's owner, PID and start time: a later master with a
    recycled PID (PID 1 in a restarted container) must not inherit an old
    plan, old slots or an old refusal. The start time is the kernel's, in
    clock ticks since boot: a wall-clock time would change when the clock is
    stepped, and a replacement worker would then look for another folder.
    Only a folder :func:`hook_dir_problem` accepts is ever used.
    """
    proc = psutil.Process(int(master))
    return os.path.join(tempfile.gettempdir(), f"tuna_lab-gunicorn-{proc.uids().real}-{master}-{started(master)}")


#: The file in the hooks' state folder that says which server made it (:func:`hook_mark`).
HOOK_MARK = "server"
#: The subfolder of the hooks' state folder the workers write their slot records in, after
#: Gunicorn's ``user =`` dropped them to that user: theirs, while the folder above stays the master's.
HOOK_RECORDS = "records"
# Size caps of the small files the hooks and `pin --pid` read back.
_MARK_BYTES, _RECORD_BYTES = 512, 4096


def hook_mark(master):
    """What the marker of ``master``'s state folder says: the master's PID and start time, and the boot.

    The folder's name holds the first two; the boot tells a folder of this
    server from one a temporary folder kept across a reboot holds under the
    same name.
    """
    boot = procfs.boot_id()
    return f"tuna_lab hooks of master {int(master)} started {started(master)} boot {boot}\n"


def hook_dir_problem(path, master, owner):
    """Why the hooks' state folder ``path`` of ``master`` cannot be trusted; None when it can.

    Trusted only if it is a real folder of ``owner`` (the master's effective
    user, who made it: never the workers' user of Gunicorn's ``user =``) that
    no one else may write, holding the marker its maker wrote before giving it
    its name (:func:`hook_mark`). A folder someone made at the name before
    the server's first worker did is refused, whoever owns it.

    Examples
    --------
    >>> hook_dir_problem("/proc/nonexistent", os.getpid(), os.geteuid())
    'it is missing'
    """
    why = _files.trusted_dir(path, {owner})
    if why:
        return f"it {why}"
    try:
        mark = _files.read_text(os.path.join(path, HOOK_MARK), limit=_MARK_BYTES, follow=False)
    except OSError:
        mark = None
    if mark != hook_mark(master):
        return "this server did not make it (it holds no marker of this server's)"
    return None


def hook_records(master):
    """The folder of ``master``'s hook records if it and the state folder above it are trusted; else None."""
    try:
        proc = psutil.Process(int(master))
        owner = proc.uids().effective
        # The records are written by the workers, under Gunicorn's `user =` as that user.
        writers = {owner} | {child.uids().effective for child in proc.children()}
        if hook_dir_problem(hook_dir(master), master, owner):
            return None
    except (psutil.Error, OSError):
        return None
    records = os.path.join(hook_dir(master), HOOK_RECORDS)
    return None if _files.trusted_dir(records, writers) else records


def remove_dead_state(kind, uid):
    """Remove ``tuna_lab-KIND-UID-PID-START`` folders of this user in the temporary folder whose process is gone.

    Such folders are named after a process (a Gunicorn master, a pinned
    server's master) and its kernel start time; they outlive it when it is
    killed. One is removed only if it is this user's and private (another
    user's is never touched) and no process of that PID and start time runs.
    A name with a suffix (``.XXXXXX``: a folder being made) counts as its process's.
    """
    remove_dead_folders(tempfile.gettempdir(), rf"tuna_lab-{re.escape(kind)}-{int(uid)}-(\d+)-(\d+)(?:\..*)?",
                        lambda path, match: [(int(match[1]), int(match[2]))])


def started(master):
    """The kernel's start time of process ``master``, in clock ticks since boot (NoSuchProcess if gone)."""
    ticks = start_ticks(master)
    if ticks is None:
        raise psutil.NoSuchProcess(int(master))
    return ticks




def trusted_hook_dir(path, owners):
    """Whether ``path`` is a real folder (no symlink) owned by one of ``owners`` that no one else may write.

    Examples
    --------
    >>> trusted_hook_dir("/proc/nonexistent", {os.getuid()})
    False
    """
    return _files.trusted_dir(path, owners) is None


def write_hook_record(records, slot, pid, exact_main):
    """Record in the folder ``records`` that worker ``pid`` holds ``slot`` and how its main thread is bound."""
    # A new file renamed into place: never written through a link or into a file someone else made.
    _files.write_json(os.path.join(records, f"slot-{slot}.json"),
                      {"slot": slot, "pid": pid, "exact_main": bool(exact_main)}, mode=0o600, durable=False)


def hooked_workers(master):
    """``{pid: (slot, exact_main)}`` of the workers the Gunicorn hooks placed (none for other servers)."""
    records = hook_records(master)
    if records is None:
        return {}
    out = {}
    for path in glob.glob(os.path.join(glob.escape(records), "slot-*.json")):
        try:
            rec = _files.read_json(path, limit=_RECORD_BYTES, follow=False)
            out[int(rec["pid"])] = (int(rec["slot"]), bool(rec["exact_main"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out
