"""Files read and written safely: the one place that says how.

tuna_lab reads paths a user names (a plan, an hwloc XML, a filesystem root,
a results folder) and writes into folders another local user may be able to
write too (``/tmp``, ``/run/lock``, a Gunicorn hook folder handed to the
workers' user). Such a user can plant a symbolic link where we are about to
write (and a process running as root would write through it), a FIFO where we
are about to read (an ``open`` that never returns), or ``/dev/zero`` (a read
that never ends). So:

* **writing** (:func:`write_atomic`, :func:`write_json`, :func:`open_new`):
  a new file is created ``O_CREAT|O_EXCL|O_NOFOLLOW`` under a name of
  ``mkstemp``'s, filled, flushed and renamed over the target. ``rename``
  replaces a link at the target instead of following it, and ``O_EXCL`` never
  opens a file someone else made;
* **reading** (:func:`read_bytes`, :func:`read_text`, :func:`read_json`):
  opened ``O_NONBLOCK`` (a FIFO opens at once instead of waiting for a
  writer), refused unless a regular file (``/proc`` and ``/sys`` files are
  regular files, of size 0 or 4096 whatever they hold, so the cap below is
  what bounds them), read up to a size cap, and JSON parsed with a bound on
  its nesting;
* **folders** (:func:`private_dir`, :func:`trusted_dir`): a state folder is
  used only if it is a real folder, owned by an expected user, that no one
  else may write;
* **whole paths** (:func:`check_path`, :func:`safe_dir`, :func:`check_output`):
  every results, cache and state folder and every output file a user names is
  walked from ``/`` as the kernel resolves it, and refused if another user
  could redirect it: a link that user planted (or could have), a folder on
  the way that user owns or may write. A check of the last folder alone
  misses ``mine/out -> /root/secret`` planted in a folder another user owns.

Every refusal is an :class:`~tuna_lab.errors.UnsafeFileError` (a
:class:`~tuna_lab.errors.TunaError` and an :class:`OSError`, so a caller that
already handles unreadable files handles these too) with one line that
names the path and the reason; callers may pass their own error class.

Examples
--------
>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "a.json")
>>> write_json(path, {"a": [1, 2]}) == path
True
>>> read_json(path)
{'a': [1, 2]}
>>> read_json("/dev/zero")
Traceback (most recent call last):
...
tuna_lab.errors.UnsafeFileError: /dev/zero is not a regular file (a character device); refusing to read it
"""

import contextlib
import errno
import json
import os
import stat
import tempfile

from .errors import UnsafeFileError

__all__ = ["MAX_FILE_BYTES", "MAX_JSON_DEPTH", "open_regular", "read_bytes", "read_text", "read_json", "loads_json",
           "write_atomic", "write_json", "open_new", "trusted_dir", "private_dir", "file_kind", "check_path",
           "safe_dir", "check_output"]

#: Default cap on a file read whole (plans, manifests, hwloc XML, sysfs files): 64 MiB.
MAX_FILE_BYTES = 64 << 20
#: Deepest nesting of arrays and objects a JSON document may have. Ours nest 5 deep at most; Python's
#: parser recurses once per level and fails near 1,000 with a RecursionError, not a clear line.
MAX_JSON_DEPTH = 100

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


def file_kind(mode):
    """What a ``st_mode`` is, in words ("a FIFO", "a folder"...); "a regular file" for one."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "not a file"


def _reason(exc):
    if exc.errno == errno.ELOOP:
        return "is a symbolic link"
    return f"cannot be read ({exc.strerror or exc})"


def read_bytes(path, limit=MAX_FILE_BYTES, follow=True, error=UnsafeFileError):
    """The bytes of the regular file ``path``, at most ``limit`` of them, read without blocking on a FIFO.

    Parameters
    ----------
    path : str
        The file.
    limit : int
        Refuse a file longer than this many bytes.
    follow : bool
        Follow a symbolic link at ``path`` itself (a user's own paths may be
        links); False refuses one (files in a shared folder).
    error : type
        The exception class raised (``FileNotFoundError`` is always raised as itself,
        so that a caller can tell "absent" from "refused").

    Examples
    --------
    >>> read_bytes("/proc/self/comm", limit=64).endswith(b"\\n")
    True
    """
    fd = open_regular(path, follow, error)
    try:
        chunks, size = [], 0
        while True:
            try:
                chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            except OSError as exc:
                raise error(f"{path} {_reason(exc)}") from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise error(f"{path} is larger than {limit:,} bytes; refusing to read it")
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_regular(path, follow=True, error=UnsafeFileError, name=None):
    """A read-only descriptor of the regular file ``path``, checked by what was opened.

    Opened without blocking (a FIFO planted at the name cannot hang the
    reader) and, with ``follow`` False, without following a link. The name
    is looked at before it is opened, because opening some devices does
    something (a watchdog arms itself), and what was opened is checked
    again, because the name may have been swapped in between. The caller
    closes the descriptor. ``name`` is how the file is called in the error
    (default ``path``); ``FileNotFoundError`` is raised as itself.

    Examples
    --------
    >>> fd = open_regular("/proc/self/comm")
    >>> os.close(fd)
    >>> open_regular("/dev/null")
    Traceback (most recent call last):
    ...
    tuna_lab.errors.UnsafeFileError: /dev/null is not a regular file (a character device); refusing to read it
    """
    name = path if name is None else name
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        mode = (os.stat if follow else os.lstat)(path).st_mode
        if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
            fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise error(f"{name} {_reason(exc)}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise error(f"{name} is not a regular file ({file_kind(mode)}); refusing to read it")
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise error(f"{name} is not a regular file ({file_kind(mode)}); refusing to read it")
    return fd


def read_text(path, limit=MAX_FILE_BYTES, follow=True, error=UnsafeFileError):
    """:func:`read_bytes` decoded as UTF-8 (undecodable bytes refused with one line)."""
    data = read_bytes(path, limit, follow, error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{path} is not UTF-8 text") from None


def _depth(text, limit):
    """Whether the JSON ``text`` nests arrays/objects deeper than ``limit`` (strings skipped)."""
    # Only scanned when the text has that many brackets at all: a cheap test first.
    if text.count("[") + text.count("{") <= limit:
        return False
    depth, i, n = 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
        i += 1
    return False


def loads_json(text, where="JSON", max_depth=MAX_JSON_DEPTH, error=UnsafeFileError):
    """Parse JSON ``text``, refusing nesting deeper than ``max_depth`` and any malformed text with one line.

    Examples
    --------
    >>> loads_json('{"a": 1}')
    {'a': 1}
    >>> loads_json("[" * 200 + "]" * 200, where="x")
    Traceback (most recent call last):
    ...
    tuna_lab.errors.UnsafeFileError: x nests deeper than 100 levels; refusing to parse it
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise error(f"{where} is not UTF-8 text") from None
    if _depth(text, max_depth):
        raise error(f"{where} nests deeper than {max_depth} levels; refusing to parse it")
    try:
        return json.loads(text)
    except RecursionError:
        raise error(f"{where} nests too deeply; refusing to parse it") from None
    except ValueError as exc:
        raise error(f"{where} is not JSON: {str(exc).splitlines()[0][:120]}") from None


def read_json(path, limit=MAX_FILE_BYTES, follow=True, max_depth=MAX_JSON_DEPTH, error=UnsafeFileError):
    """The JSON document in ``path``, read as :func:`read_bytes` reads and parsed as :func:`loads_json` parses."""
    return loads_json(read_bytes(path, limit, follow, error), where=str(path), max_depth=max_depth, error=error)


def _fsync_dir(folder):
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(path, data, mode=0o644, durable=True, error=UnsafeFileError, parents=False):
    """Write ``data`` (str or bytes) to ``path`` whole or not at all; never through a link; return ``path``.

    A new file of ``mkstemp``'s (``O_CREAT|O_EXCL``: never one someone else
    made, never through a link) in the same folder is filled, flushed and
    renamed over ``path``; a link at ``path`` is replaced, not followed. With
    ``durable`` the folder's entries are flushed too. On any error the
    temporary file is removed and ``error`` raised with one line; what was at
    ``path`` before is untouched. With ``parents``, a missing folder is made
    first (:func:`safe_dir`, which checks its whole path).

    Examples
    --------
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> os.symlink("/etc/passwd", os.path.join(folder, "x"))
    >>> _ = write_atomic(os.path.join(folder, "x"), "data")
    >>> os.path.islink(os.path.join(folder, "x")), open(os.path.join(folder, "x")).read()
    (False, 'data')
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if parents and not os.path.isdir(folder):
        safe_dir(folder, "cannot write into", error, sticky=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            raise IsADirectoryError(errno.EISDIR, "is a folder")
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    except OSError as exc:
        raise error(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise error(f"cannot write {path}: {exc.strerror or exc}") from None
        raise
    if durable:
        _fsync_dir(folder)
    return path


def write_json(path, data, mode=0o644, durable=True, error=UnsafeFileError, **options):
    """Write ``data`` as JSON to ``path`` as :func:`write_atomic` writes; ``options`` go to :func:`json.dumps`.

    The text is made before anything is written: data that cannot be written
    as JSON (an overflowing number, NaN with ``allow_nan=False``) leaves no file.
    """
    options.setdefault("indent", 1)
    try:
        text = json.dumps(data, **options) + "\n"
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise error(f"cannot write {path}: {type(exc).__name__}: {str(exc)[:120]}") from None
    return write_atomic(path, text, mode=mode, durable=durable, error=error)


def open_new(path, mode=0o600, flags=os.O_WRONLY, error=UnsafeFileError):
    """A descriptor of a file created now at ``path`` (``O_CREAT|O_EXCL|O_NOFOLLOW``); raise if anything is there.

    ``FileExistsError`` is raised as itself (a lock or marker another process
    of ours created first is the usual case, not an attack).
    """
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except FileExistsError:
        raise
    except OSError as exc:
        raise error(f"cannot create {path}: {exc.strerror or exc}") from None


def trusted_dir(path, owners):
    """Why the folder ``path`` cannot be trusted (None when it can): a real folder of ``owners`` no one else writes.

    Examples
    --------
    >>> trusted_dir("/proc/nonexistent", {os.getuid()})
    'is missing'
    >>> trusted_dir("/tmp", {0, os.getuid()})
    'may be written by other users'
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "is missing"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return f"is not a folder ({file_kind(st.st_mode)})"
    if st.st_uid not in set(owners):
        return f"belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return "may be written by other users"
    return None


def private_dir(path, error=UnsafeFileError):
    """Create the folder ``path`` 0700 for this user, or accept it if it is already theirs and private; return it.

    Anything else at ``path`` (a link, a file, another user's folder, a
    folder others may write) is refused with ``error``.
    """
    with contextlib.suppress(FileExistsError):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            raise
        except OSError as exc:
            raise error(f"cannot create the folder {path}: {exc.strerror or exc}") from None
    why = trusted_dir(path, {os.geteuid()})
    if why:
        raise error(f"refusing the folder {path}: it {why}")
    return path


#: Links followed on one path at most (the kernel's own limit, ``MAXSYMLINKS``).
_MAX_LINKS = 40


def _owners():
    """Who may own a folder or link on a path we trust: root and this user."""
    return {0, os.geteuid()}


def _folder_problem(st, sticky=True):
    """Why a folder cannot be trusted (None when it can).

    Like sudo's and OpenSSH's rules for a secure path: its owner is root or
    this user, and no one else may write it - a group-writable folder only
    when its group is root's or ours. With ``sticky``, a sticky folder
    (``/tmp``) is fine: others may add names to it, but not remove or rename
    ours. Not so for a folder we make things in by names anyone can predict
    (a cell, its ``.tmp-<pid>``, a lock): others could plant links first.
    """
    if st.st_uid not in _owners():
        return f"belongs to another user (uid {st.st_uid})"
    if sticky and st.st_mode & stat.S_ISVTX:
        return None
    if st.st_mode & stat.S_IWOTH:
        return "may be written by other users"
    if st.st_mode & stat.S_IWGRP and st.st_gid not in {0, os.getegid()}:
        return f"may be written by group {st.st_gid}"
    return None


def check_path(path, what="path", error=UnsafeFileError, link=True, sticky=False):
    """Refuse a path on which another user could redirect what we write or read; return what is there.

    ``path`` is walked from ``/`` component by component as the kernel
    resolves it, links followed (at most 40):

    * a folder on the way must belong to root or this user and be writable
      by no one else, a sticky folder such as ``/tmp`` excepted;
    * a link on the way must belong to root or this user (it lies in a
      folder that passed the rule above, so no one else put it there);
    * the last component, when it is a folder, must be writable by no one
      else, even sticky (unless ``sticky``): what we make in it has names
      anyone can predict;
    * ``link=False`` refuses a link as the last component (a file written or
      read by that name: we never write through one).

    The walk stops at the first component that is missing: we make the rest
    (and :func:`safe_dir` checks again once it has made them).

    Parameters
    ----------
    path : str or os.PathLike
    what : str
        What the path is, for the message ("--out", "the model cache").
    error : type
        The exception class raised, with one line.
    link : bool
        Whether the last component may be a link (of root's or ours).
    sticky : bool
        Whether the last component may be a sticky folder others may write
        (a folder we only make files in with :func:`write_atomic`).

    Returns
    -------
    tuple
        ``(real, st)``: the path with every link resolved, and the
        ``os.lstat`` of what is there (None when nothing is).

    Examples
    --------
    >>> check_path("/tmp", sticky=True)[0]
    '/tmp'
    >>> check_path("/tmp", "--out")
    Traceback (most recent call last):
    ...
    tuna_lab.errors.UnsafeFileError: --out /tmp: the folder /tmp may be written by other users; give a folder only you may write
    """
    shown = os.fsdecode(path)
    if "\0" in shown:
        raise error(f"{what} {shown!r} holds a NUL character")
    try:
        # Not abspath: it would drop "link/.." lexically, where the kernel goes to the link target's parent.
        full = shown if os.path.isabs(shown) else os.path.join(os.getcwd(), shown)
    except OSError as exc:
        raise error(f"{what} {shown}: the working folder is gone ({exc.strerror or exc})") from None
    parts = full.split("/")[::-1]      # a stack: the next component last
    current, st, links = "/", os.lstat("/"), 0
    while parts:
        name = parts.pop()
        if name in ("", "."):
            continue
        if name == "..":
            # Its parent was checked on the way here (or is the root).
            current = os.path.dirname(current)
            st = os.lstat(current)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise error(f"{what} {shown}: {current} is not a folder ({file_kind(st.st_mode)})")
        why = _folder_problem(st)
        if why:
            raise error(f"{what} {shown}: the folder {current} {why}; refusing to use a path through it")
        step = os.path.join(current, name)
        try:
            st = os.lstat(step)
        except FileNotFoundError:
            parts.append(name)
            rest = [p for p in reversed(parts) if p not in ("", ".")]
            return os.path.normpath(os.path.join(current, *rest)), None
        except OSError as exc:
            raise error(f"{what} {shown}: {step} cannot be read ({exc.strerror or exc})") from None
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in _owners():
                raise error(f"{what} {shown}: {step} is a symbolic link of another user (uid {st.st_uid}); "
                            "refusing to follow it")
            if not link and not any(p not in ("", ".") for p in parts):
                raise error(f"{what} {shown} is a symbolic link; refusing to write or read through it")
            links += 1
            if links > _MAX_LINKS:
                raise error(f"{what} {shown}: too many symbolic links")
            target = os.readlink(step)
            parts.extend(target.split("/")[::-1])
            if target.startswith("/"):
                current, st = "/", os.lstat("/")
            else:
                st = os.lstat(current)
            continue
        current = step
    if stat.S_ISDIR(st.st_mode):
        why = _folder_problem(st, sticky)
        if why:
            raise error(f"{what} {shown}: the folder {current} {why}; give a folder only you may write")
    return current, st


def safe_dir(path, what="folder", error=UnsafeFileError, mode=0o775, sticky=False):
    """Make the folder ``path`` (and those above it) unless there, after and before :func:`check_path`; return it.

    Checked again once made: another user who may add names on the way
    could have put a link where we were about to make a folder. Each folder
    is made ``mode`` (less the umask): not 0777, which a umask of 0 would
    leave for every user to write, and :func:`check_path` refuse. ``sticky``
    as for :func:`check_path`.

    Examples
    --------
    >>> import tempfile
    >>> folder = os.path.join(tempfile.mkdtemp(), "a", "b")
    >>> safe_dir(folder) == folder and os.path.isdir(folder)
    True
    """
    real, st = check_path(path, what, error, sticky=sticky)
    if st is None:
        missing = []
        while not os.path.lexists(real):
            real, name = os.path.split(real)
            missing.append(name)
        for name in reversed(missing):
            real = os.path.join(real, name)
            try:
                os.mkdir(real, mode)
            except FileExistsError:
                pass                        # made meanwhile (by us, or it is checked below)
            except OSError as exc:
                raise error(f"{what} {os.fspath(path)}: cannot create {real}: {exc.strerror or exc}") from None
        real, st = check_path(path, what, error, sticky=sticky)
    if st is None or not stat.S_ISDIR(st.st_mode):
        kind = "missing" if st is None else file_kind(st.st_mode)
        raise error(f"{what} {os.fspath(path)} is not a folder ({kind})")
    return path


def check_output(path, what="output", error=UnsafeFileError):
    """Refuse, before any work, a file we could not safely write at ``path``; return ``path``.

    Its path passes :func:`check_path` without a link at the end; what is
    there is nothing or a regular file (not a folder, a FIFO, a device); a
    file is created and removed in its folder (or, when that is still
    missing, in the nearest folder above it, where it would be made) -
    ``/proc`` and a read-only mount refuse here, not after an hour's work.
    Nothing is left behind. The file itself is written later with
    :func:`write_atomic` (``parents=True`` where its folder may be missing).

    Examples
    --------
    >>> check_output("/proc/version", "--out")   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tuna_lab.errors.UnsafeFileError: --out /proc/version cannot be written: /proc takes no new file (...)
    """
    shown = os.fspath(path)
    real, st = check_path(shown, what, error, link=False)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {shown} is {file_kind(st.st_mode)}, not a regular file; refusing to write it")
    folder = os.path.dirname(real)
    while not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    # A file is made in it only by mkstemp and rename: a sticky folder (/tmp) is safe for that.
    check_path(folder, what, error, sticky=True)
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(real)}.", suffix=".probe")
    except OSError as exc:
        raise error(f"{what} {shown} cannot be written: {folder} takes no new file ({exc.strerror or exc})") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return path
