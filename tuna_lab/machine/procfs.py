"""Processes as ``/proc`` tells them: when one started, whether it still runs, and the state it leaves behind.

A PID alone does not name a process: the kernel gives it to another once
the first exits. A PID with its start time (field 22 of
``/proc/PID/stat``, clock ticks since boot) names one process for the
machine's uptime, and is what every record of tuna_lab that names a process
(a server's pidfile sidecar, a state folder's name or owner record) keeps.

Every read goes through :mod:`tuna_lab._files` (non-blocking, regular file,
size-capped), so a ``root`` copied from another machine cannot hang or
exhaust a reader.

Examples
--------
>>> start_ticks(os.getpid()) > 0
True
>>> alive(os.getpid(), start_ticks(os.getpid())), alive(os.getpid(), -1)
(True, False)
"""

import os
import re
import shutil

from .. import _files

__all__ = ["start_ticks", "alive", "process_age", "remove_dead_folders"]

_STAT_LIMIT = 4096


def start_ticks(pid):
    """When process ``pid`` started, in clock ticks since boot; None if it is gone (or ``pid`` is no PID).

    Examples
    --------
    >>> start_ticks(2 ** 22 + 1) is None
    True
    """
    try:
        data = _files.read_bytes(f"/proc/{int(pid)}/stat", limit=_STAT_LIMIT)
        # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
        return int(data[data.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, TypeError, IndexError):
        return None


def alive(pid, ticks):
    """Whether the process of PID ``pid`` that started at ``ticks`` still runs (a reused PID does not count)."""
    return ticks is not None and start_ticks(pid) == ticks


def process_age(pid="self"):
    """Seconds since process ``pid`` started (0.0 where ``/proc`` does not say).

    Examples
    --------
    >>> 0 <= process_age() < 3600 * 24 * 365
    True
    """
    try:
        ticks = start_ticks(os.getpid() if pid == "self" else pid)
        uptime = float(_files.read_text("/proc/uptime", limit=_STAT_LIMIT).split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return 0.0 if ticks is None else max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))


def remove_dead_folders(root, pattern, users_of):
    """Remove the folders in ``root`` named ``pattern`` that are ours and whose processes have all exited.

    tuna_lab's state folders in the shared temporary folder (a server's
    state, the Gunicorn hooks', a pin's saved masks) outlive their process
    when it is killed. A folder is removed only when it is this user's and
    private (:func:`~tuna_lab._files.trusted_dir`: another user's is never
    touched) and ``users_of`` names processes, none of which runs.

    Parameters
    ----------
    root : str
        The folder to look in.
    pattern : str
        A regular expression the whole entry name must match.
    users_of : callable
        ``(path, match) -> [(pid, start ticks), ...]``: the processes that
        keep the folder in use; an empty list leaves it alone.

    Returns
    -------
    list of str
        The folders removed.

    Examples
    --------
    >>> remove_dead_folders("/proc/nonexistent", r"x", lambda path, m: [])
    []
    """
    name = re.compile(pattern)
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return []
    removed = []
    for entry in entries:
        match = name.fullmatch(entry)
        path = os.path.join(root, entry)
        if not match or _files.trusted_dir(path, {os.geteuid()}) is not None:
            continue
        users = users_of(path, match)
        if users and not any(alive(pid, ticks) for pid, ticks in users):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
