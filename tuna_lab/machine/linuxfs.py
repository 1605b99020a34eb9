"""The files of a Linux filesystem root: sysfs CPU lists and masks, mounts, this process's cgroups.

Everything here takes ``root``, the directory standing for ``/``: ``"/"`` for
the live machine, or a copied tree such as the hwloc test dumps that
``lstopo --input DIR`` reads. The topology reader
(:mod:`~tuna_lab.machine.readers.sysfs`) and the process limits
(:mod:`~tuna_lab.machine.limits`) both read through these functions, so the
live machine and a dump are read by the same code.

Files are read as hwloc reads them: the text stops at the first NUL byte and
surrounding whitespace is ignored; a missing or unreadable file is ``None``.
The cgroup of "this process" is the one ``root/proc/self/cgroup`` (and
``root/proc/self/cpuset``) names; it is found in the mount that
``root/proc/self/mountinfo`` (or ``root/proc/mounts``) lists, trying the
standard places under ``/sys/fs/cgroup`` first, as hwloc does.

Examples
--------
>>> set(online_cpus("/sys/devices/system/cpu")) >= set(__import__("os").sched_getaffinity(0))
True
>>> cgroup_cpu_quota("/") is None or cgroup_cpu_quota("/") > 0
True
"""

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from .. import _files
from .._checks import parse_cpulist, parse_cpumask
from ..errors import TopologyError

__all__ = ["MAX_KERNEL_FILE", "read_text", "read_cpulist", "system_cpus", "cgroup_quota", "read_cpumask",
           "online_cpus", "Mount", "mounts", "cgroup_dir", "cgroup_cpuset", "cgroup_cpu_quota"]

#: Largest kernel file read (``/proc/cpuinfo`` of 4096 CPUs is about 6 MB; a sysfs attribute is a page).
MAX_KERNEL_FILE = 16 << 20

_CPU_DIR = re.compile(r"cpu(\d+)")
_OCTAL = re.compile(r"\\([0-7]{3})")

# Per controller, the file that marks a directory of its hierarchy, by kind of
# mount: cgroup v2, cgroup v1, and the old standalone "cpuset" filesystem.
_MARKERS = {
    "cpuset": {"v2": "cpuset.cpus.effective", "v1": "cpuset.cpus", "cpuset": "cpus"},
    "cpu": {"v2": "cpu.max", "v1": "cpu.cfs_quota_us"},
}


def read_text(path):
    """Text of a small kernel file up to its first NUL byte, stripped; None if it is missing or unreadable.

    Read as :func:`tuna_lab._files.read_bytes` reads (without blocking, a
    regular file, at most :data:`MAX_KERNEL_FILE` bytes): in a copied root,
    a FIFO, a device (``/dev/zero``) or an oversized file where a kernel file
    should be is refused, not waited on or read forever. sysfs and procfs
    files are regular files, so the live machine reads as before.

    Raises
    ------
    TopologyError
        The path is not a regular file, or is larger than :data:`MAX_KERNEL_FILE`.

    Examples
    --------
    >>> read_text("/sys/devices/system/cpu/online") is not None
    True
    >>> read_text("/no/such/file") is None
    True
    >>> read_text("/dev/zero")
    Traceback (most recent call last):
    ...
    tuna_lab.errors.TopologyError: /dev/zero is not a regular file (a character device); refusing to read it
    """
    # Missing, unreadable or a folder is "no such file", as hwloc takes it; what is there but no
    # regular file is refused by the read itself (the check and the read are one open).
    try:
        if stat.S_ISDIR(os.stat(path).st_mode) or not os.access(path, os.R_OK):
            return None
        data = _files.read_bytes(path, limit=MAX_KERNEL_FILE, error=TopologyError)
    except OSError:
        return None
    return data.decode(errors="replace").split("\x00", 1)[0].strip()


def read_cpulist(path):
    """The CPU ids of a cpulist file (``"0-3,8"``), or None if it cannot be read.

    Raises
    ------
    TopologyError
        The file holds something else than a cpulist.

    Examples
    --------
    >>> 0 in read_cpulist("/sys/devices/system/cpu/online")
    True
    """
    text = read_text(path)
    return None if text is None else parse_cpulist(text, path)


def system_cpus(kind):
    """The CPUs of this machine of one ``kind`` - ``"online"``, ``"offline"``, ``"isolated"``, ``"present"`` -
    as sysfs lists them (``/sys/devices/system/cpu/KIND``); None where the file cannot be read.

    Examples
    --------
    >>> 0 in system_cpus("online")
    True
    """
    if kind not in ("online", "offline", "isolated", "present", "possible"):
        raise ValueError(f"no such CPU list: {kind!r}")
    return read_cpulist(f"/sys/devices/system/cpu/{kind}")


def read_cpumask(path):
    """The CPU ids of a hex mask file (``"00000000,0000000f"``), or None if it cannot be read.

    Raises
    ------
    TopologyError
        The file holds something else than a CPU mask.

    Examples
    --------
    >>> # skipped: the file exists on Linux 5.x sysfs with CPU topology only
    >>> 0 in read_cpumask("/sys/devices/system/cpu/cpu0/topology/core_cpus")  # doctest: +SKIP
    True
    """
    text = read_text(path)
    return None if text is None else parse_cpumask(text, path)


def online_cpus(cpu_dir):
    """Sorted ids of the online CPUs among the ``cpuN`` directories of a sysfs cpu directory.

    ``cpu_dir/online`` (a cpulist) says which are online; without it, each
    CPU's own ``cpuN/online`` file does (``0`` is offline; no file, as for a
    CPU that cannot be unplugged, is online) - the rule hwloc follows.

    Examples
    --------
    >>> online_cpus("/sys/devices/system/cpu")[0] >= 0
    True
    """
    cpu_dir = Path(cpu_dir)
    present = sorted(int(m.group(1)) for p in cpu_dir.iterdir() if (m := _CPU_DIR.fullmatch(p.name)))
    online = read_cpulist(cpu_dir / "online")
    if online is not None:
        return sorted(set(present) & set(online))
    return [cpu for cpu in present if read_text(cpu_dir / f"cpu{cpu}" / "online") != "0"]


@dataclass(frozen=True)
class Mount:
    """One line of the mount table.

    Attributes
    ----------
    point : str
        Where it is mounted (absolute, inside the filesystem root).
    root : str
        The directory of the mounted filesystem shown there (``/`` unless
        only a subtree is mounted, as in a container's cgroup mounts).
    fstype : str
        ``"cgroup2"``, ``"cgroup"``, ``"cpuset"``, ``"sysfs"``...
    options : frozenset of str
        Mount and superblock options; a cgroup v1 mount lists its controllers here.
    """

    point: str
    root: str
    fstype: str
    options: frozenset


def mounts(root="/"):
    """The mount table of ``root``: ``proc/self/mountinfo``, else ``proc/mounts``; empty if neither.

    Examples
    --------
    >>> any(m.point == "/" for m in mounts())
    True
    """
    root = Path(root)
    table = []
    text = read_text(root / "proc/self/mountinfo")
    if text:
        for line in text.splitlines():
            head, sep, tail = line.partition(" - ")
            head, tail = head.split(), tail.split()
            if sep and len(head) >= 6 and len(tail) >= 3:
                table.append(Mount(_unescape(head[4]), _unescape(head[3]), tail[0],
                                   frozenset(head[5].split(",") + tail[2].split(","))))
        return table
    for line in (read_text(root / "proc/mounts") or "").splitlines():
        fields = line.split()
        if len(fields) >= 4:
            table.append(Mount(_unescape(fields[1]), "/", fields[2], frozenset(fields[3].split(","))))
    return table


def cgroup_dir(root, controller):
    """``(kind, directory)`` of this process's cgroup for ``controller``, or None if there is none.

    ``kind`` is ``"v2"``, ``"v1"`` or ``"cpuset"`` (the pre-cgroup cpuset
    filesystem); ``directory`` is the cgroup's directory inside ``root`` (it
    may be missing from a partial dump). The hierarchy is looked for as hwloc
    does: the standard mounts under ``/sys/fs/cgroup`` (and ``/dev/cpuset``),
    then the mount table; the cgroup path comes from ``proc/self/cpuset`` (for
    the cpuset controller, as hwloc reads it) or ``proc/self/cgroup``.

    Parameters
    ----------
    root : str or path
        The filesystem root.
    controller : {"cpuset", "cpu"}

    Examples
    --------
    >>> kind, directory = cgroup_dir("/", "cpu") or ("none", None)
    >>> kind in ("v1", "v2", "none")
    True
    """
    found = _locate(Path(root), controller)
    return None if found is None else found[:2]


def cgroup_cpuset(root="/"):
    """The CPUs this process's cgroup cpuset allows, or None if no cpuset says.

    Reads ``cpuset.cpus.effective`` (cgroup v2), ``cpuset.cpus`` (v1) or
    ``cpus`` (cpuset filesystem) of the cgroup :func:`cgroup_dir` finds, or of
    its nearest ancestor that has the file (the kernel applies the nearest
    cpuset). Offline CPUs may be listed: intersect with :func:`online_cpus`.

    Examples
    --------
    >>> cpus = cgroup_cpuset("/")
    >>> cpus is None or set(cpus) >= __import__("os").sched_getaffinity(0)
    True
    """
    found = _locate(Path(root), "cpuset")
    if found is None:
        return None
    kind, directory, top = found
    for d in _up_to(directory, top):
        cpus = read_cpulist(d / _MARKERS["cpuset"][kind])
        if cpus is not None:
            return cpus
    return None


def cgroup_cpu_quota(root="/"):
    """This process's CFS CPU quota in CPUs' worth (``1.5`` = 150 ms per 100 ms), or None if unlimited.

    cgroup v2 ``cpu.max`` (``"max 100000"`` is no limit, ``"150000 100000"``
    is 1.5); cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (``-1`` is
    no limit). The kernel enforces the quota of every ancestor too, so the
    cgroup and its ancestors up to the mount are read and the tightest quota wins.

    Examples
    --------
    >>> quota = cgroup_cpu_quota("/")
    >>> quota is None or quota > 0
    True
    """
    found = _locate(Path(root), "cpu")
    if found is None:
        return None
    kind, directory, top = found
    quotas = [q for d in _up_to(directory, top)
              if (q := cgroup_quota(d, kind)) is not None]
    return min(quotas) if quotas else None


# ------------------------------------------------------------------ helpers
def _unescape(text):
    """A mount table field with its octal escapes (``\\040`` for a space) decoded."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), text)


def _inside(root, absolute):
    """The path of ``absolute`` (an absolute path of the machine) inside ``root``."""
    return Path(root) / str(absolute).lstrip("/")


def _is_under(path, top):
    """Whether ``path`` is ``top`` or below it (as strings: the paths may not exist)."""
    return os.path.normpath(path) == os.path.normpath(top) or \
        os.path.normpath(path).startswith(os.path.normpath(top).rstrip("/") + "/")


def _hierarchy(root, controller):
    """``(kind, mount point)`` of the hierarchy holding ``controller``, or None."""
    markers = _MARKERS[controller]
    # The standard places first, in hwloc's order (v2, v1, the cpuset filesystem).
    std = _inside(root, "/sys/fs/cgroup")
    if controller in (read_text(std / "cgroup.controllers") or "").split() or (std / markers["v2"]).exists():
        return "v2", "/sys/fs/cgroup"
    if std.is_dir():
        for d in sorted(std.iterdir()):
            if controller in d.name.split(",") and (d / markers["v1"]).exists():
                return "v1", f"/sys/fs/cgroup/{d.name}"
    if "cpuset" in markers and (_inside(root, "/dev/cpuset") / markers["cpuset"]).exists():
        return "cpuset", "/dev/cpuset"
    for m in mounts(root):
        if m.fstype == "cgroup2" and \
                controller in (read_text(_inside(root, m.point) / "cgroup.controllers") or "").split():
            return "v2", m.point
        if m.fstype == "cpuset" and "cpuset" in markers:
            return "cpuset", m.point
        if m.fstype == "cgroup" and controller in m.options:
            # A v1 cpuset mounted with "noprefix" names its files as the cpuset filesystem does.
            return ("cpuset" if "noprefix" in m.options and "cpuset" in markers else "v1"), m.point
    return None


def _cgroup_path(root, controller):
    """The cgroup path of this process in v1 ``controller``'s hierarchy, or in v2's if ``controller`` is None."""
    for line in (read_text(root / "proc/self/cgroup") or "").splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if (controller is None and controllers == "") or \
                (controller is not None and controller in controllers.split(",")):
            return path
    return None


def _locate(root, controller):
    """``(kind, cgroup directory, mount directory)`` of this process's ``controller`` cgroup, or None."""
    found = _hierarchy(root, controller)
    if found is None:
        return None
    kind, point = found
    path = read_text(root / "proc/self/cpuset") if controller == "cpuset" else None
    if not path and kind != "cpuset":
        path = _cgroup_path(root, controller if kind == "v1" else None)
    if not path:
        return None
    top = _inside(root, point)
    # A container may see only a subtree of the hierarchy (its mount's root):
    # the cgroup path is then relative to that subtree.
    mount_root = next((m.root for m in mounts(root)
                       if os.path.realpath(_inside(root, m.point)) == os.path.realpath(top)), "/")
    inside = os.path.relpath(path, mount_root) if _is_under(path, mount_root) else "."
    return kind, Path(os.path.normpath(top / inside)), Path(os.path.normpath(top))


def _up_to(directory, top):
    """``directory`` and its ancestors up to ``top``, innermost first."""
    chain = [directory]
    while directory != top and _is_under(str(directory), str(top)):
        directory = directory.parent
        chain.append(directory)
    return chain


def cgroup_quota(directory, version):
    """CPUs' worth of the CFS quota set in one cgroup ``directory``, None for no limit or no file.

    ``version`` ``"v2"``: ``cpu.max`` (``"150000 100000"`` -> 1.5, ``max`` is
    no limit); ``"v1"``: ``cpu.cfs_quota_us / cpu.cfs_period_us`` (``-1`` is
    no limit).

    Examples
    --------
    >>> from pathlib import Path
    >>> cgroup_quota(Path("/nonexistent"), "v2") is None
    True
    """
    if version == "v2":
        fields = (read_text(directory / "cpu.max") or "").split()
        if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit() and int(fields[1]) > 0:
            return int(fields[0]) / int(fields[1])
        return None
    quota, period = read_text(directory / "cpu.cfs_quota_us"), read_text(directory / "cpu.cfs_period_us")
    try:
        quota, period = int(quota), int(period)
    except (TypeError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None
