"""The Gunicorn hooks' state folder of a server (:func:`hook_dir`) and its slot records.

The hooks (:mod:`tuna_lab.integrations.gunicorn`) keep, per master, a
folder its master made and marked (:func:`hook_mark`); the workers write
their slot records in its ``records`` subfolder; ``pin --pid`` and
``audit`` read them back (:func:`hooked_workers`, :func:`hook_records`).

:func:`state_dir` is the one per-user state folder of everything else tuna_lab
keeps about a running system (the ledger of the masks it changed, the
hooks' and the lab server's workers' included: ``hooks-MASTER-START``): made by
this user, checked as theirs, under a name another user cannot take first
(one planted in the shared temporary folder is passed over).
"""

import contextlib
import glob
import os
import re
import tempfile

import psutil

from .. import _files
from ..errors import PinError
from ..machine import procfs
from ..machine.procfs import remove_dead_folders, start_ticks

__all__ = ["hook_dir", "hook_mark", "hook_records", "hook_dir_problem", "trusted_hook_dir", "write_hook_record",
           "remove_dead_state", "hooked_workers", "started", "HOOK_MARK", "HOOK_RECORDS", "state_dir", "state_dirs",
           "refused_state_dirs", "state_lock"]

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


# -- the one per-user state folder ----------------------------------------------------------------

def _state_candidates():
    """Where this user's state folder may be, in order: ``$XDG_RUNTIME_DIR/tuna_lab`` (when that folder is
    this user's and private), ``tuna_lab-UID`` in the temporary folder, ``~/.cache/tuna_lab/state``.

    The second name is one anyone can predict: another user may make it
    first. Then it is refused (never used, never followed) and the next one
    is taken, in the home folder no one else may write.
    """
    uid = os.geteuid()
    out = []
    run = os.environ.get("XDG_RUNTIME_DIR")
    if run and os.path.isabs(run) and _files.trusted_dir(run, {uid}) is None:
        out.append(os.path.join(run, "tuna_lab"))
    out.append(os.path.join(tempfile.gettempdir(), f"tuna_lab-{uid}"))
    try:
        import pwd

        home = pwd.getpwuid(uid).pw_dir       # not $HOME: sudo may keep another user's
    except (KeyError, ImportError):
        home = None
    if home and os.path.isabs(home):
        out.append(os.path.join(home, ".cache", "tuna_lab", "state"))
    return out


def state_dirs():
    """This user's state folders that exist and are theirs and private (records are read from each)."""
    return [p for p in _state_candidates() if os.path.lexists(p) and _files.trusted_dir(p, {os.geteuid()}) is None]


def refused_state_dirs():
    """``[(path, why)]``: the candidates (:func:`state_dir`) that exist but are not this user's own private folder."""
    out = []
    for path in _state_candidates():
        if os.path.lexists(path):
            why = _files.trusted_dir(path, {os.geteuid()})
            if why:
                out.append((path, why))
    return out


def state_dir(error=PinError):
    """This user's private state folder, made now (0700) if need be: the one place tuna_lab keeps what it
    changed on a running system (:mod:`tuna_lab.live.ledger`).

    The first candidate that is this user's own private folder, or can be
    made as one, is taken; one planted by someone else is passed over.

    Raises
    ------
    PinError
        No candidate can be used (each one's reason is named).
    """
    problems = []
    for path in _state_candidates():
        try:
            if path.endswith(os.path.join(".cache", "tuna_lab", "state")):
                for parent in (os.path.dirname(os.path.dirname(path)), os.path.dirname(path)):
                    if not os.path.lexists(parent):
                        os.mkdir(parent, 0o700)
            return _files.private_dir(path, error=error)
        except (error, OSError) as exc:
            problems.append(str(exc))
    raise error("no private state folder for tuna_lab's records: " + "; ".join(problems))


@contextlib.contextmanager
def state_lock(name):
    """Hold an exclusive lock named ``name`` in the state folder (two commands that change masks of one server
    take turns: each reads the record after the other wrote it)."""
    import fcntl

    path = os.path.join(state_dir(), f"{name}.lock")
    # O_NOFOLLOW in our own private folder: no one else could have put anything there.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        os.close(fd)
