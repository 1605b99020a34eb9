"""One measurement per results folder: ``flock`` on the folder's lock file, held by one thread.

Two runs or sweeps writing one folder would measure under each other's load
and replace each other's cells; the kernel drops an ``flock`` when its
holder exits, however it exits, so no stale lock is ever left to clear.
:mod:`tuna_lab.measure.store` re-exports all three names.
"""

import contextlib
import fcntl
import os
import stat
import threading

from .. import _files
from .._files import file_kind
from ..errors import ExperimentError

__all__ = ["LOCK_NAME", "lock_folder", "held_here"]

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
    # Made and checked whole (the lock and every cell are written in it): see check_out.
    _files.safe_dir(folder, "results folder", ExperimentError)
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
            fd = _open_lock(os.path.join(key, LOCK_NAME))
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


def held_here(folder):
    """Whether this process holds the results folder ``folder`` (:func:`lock_folder`): a sweep holds its cells'."""
    with _HELD_GUARD:
        return os.path.realpath(folder) in _HELD


def _open_lock(path):
    """A descriptor of the results folder's lock file ``path`` (created if missing); one line if it is no file.

    Never through a link (``O_NOFOLLOW``), and ``O_NONBLOCK`` so that a FIFO
    planted there opens at once - and is then refused - instead of hanging.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        reason = "is a symbolic link" if os.path.islink(path) else f"cannot be opened ({exc.strerror or exc})"
        raise ExperimentError(f"the results folder's lock file {path} {reason}; remove it") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ExperimentError(f"the results folder's lock file {path} is not a regular file "
                              f"({file_kind(st.st_mode)}); remove it")
    # It is truncated and written: never a file of someone else's, nor a hard link to one.
    if st.st_uid != os.geteuid() or st.st_nlink != 1:
        os.close(fd)
        raise ExperimentError(f"the results folder's lock file {path} is not this user's own file "
                              f"(owner uid {st.st_uid}, {st.st_nlink} links); remove it")
    return fd
