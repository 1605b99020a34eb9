"""NUMA locality of a process: where its resident memory sits relative to its main thread.

Linux lists every mapping of a process in ``/proc/<pid>/numa_maps``, one line
each, with the resident pages per NUMA node as ``N<node>=<pages>`` and the
page size as ``kernelpagesize_kB=<kB>``::

    7f3a5c000000 default anon=2048 dirty=2048 N0=1536 N1=512 kernelpagesize_kB=4
    7f3a40000000 default file=/dev/hugepages/buf huge dirty=3 N1=3 kernelpagesize_kB=2048

:func:`parse_numa_maps` sums those counts over the mappings (a pure function
of the text); :func:`worker_locality` reads them for a live process and
reports the share of its resident memory on the NUMA node its main thread
runs on - the node of the CPUs in the main thread's affinity - as the
article's workers, pinned to cores by a policy, would want it: close to 1.

Shares weigh pages by size (``N`` times ``kernelpagesize_kB``), so a 2 MiB
hugetlb page counts as much as 512 pages of 4 KiB. Transparent huge pages
already appear as base pages in ordinary mappings.

Examples
--------
>>> from tuna_lab.machine.numa import parse_numa_maps
>>> maps = parse_numa_maps("7f00 default anon=3 N0=2 N1=1 kernelpagesize_kB=4\\n")
>>> maps.pages, maps.kib
({0: 2, 1: 1}, {0: 8, 1: 4})
>>> import os
>>> from tuna_lab.machine.numa import worker_locality
>>> # skipped: the share is this machine's (/proc/PID/numa_maps)
>>> worker_locality(os.getpid()).share        # doctest: +SKIP
1.0
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import NumaError, TopologyError

__all__ = ["NumaMaps", "Locality", "parse_numa_maps", "read_numa_maps", "locality", "worker_locality"]

_NODE_PAGES = re.compile(r"N(\d+)=(\d+)")
_PAGE_SIZE = re.compile(r"kernelpagesize_kB=(\d+)")
_ADDRESS = re.compile(r"[0-9a-fA-F]+")


@dataclass(frozen=True)
class NumaMaps:
    """Resident pages of a process per NUMA node, summed over its mappings.

    Attributes
    ----------
    pages : dict of int to int
        ``{node: pages}``: the ``N<node>=`` counts summed, each page counted
        once whatever its size.
    kib : dict of int to int
        ``{node: KiB}``: each count times its mapping's ``kernelpagesize_kB``.
    huge_pages : dict of int to int
        ``{node: pages}`` of hugetlb mappings (flag ``huge``) alone.
    mappings : int
        Lines (mappings) read.
    empty_mappings : int
        Mappings without any resident page (no ``N`` field).
    """

    pages: dict = field(default_factory=dict)
    kib: dict = field(default_factory=dict)
    huge_pages: dict = field(default_factory=dict)
    mappings: int = 0
    empty_mappings: int = 0

    @property
    def total_kib(self) -> int:
        """Resident memory on all nodes, in KiB."""
        return sum(self.kib.values())

    def share(self, node) -> float:
        """Fraction of the resident memory (KiB) on ``node``; NaN without resident pages.

        Examples
        --------
        >>> parse_numa_maps("1000 default N0=3 N1=1 kernelpagesize_kB=4").share(0)
        0.75
        """
        total = self.total_kib
        return self.kib.get(int(node), 0) / total if total else float("nan")


@dataclass(frozen=True)
class Locality:
    """Where a worker's resident memory is, relative to the NUMA node of its main thread.

    Attributes
    ----------
    pid : int
        The process (its main thread has TID ``pid``).
    node : int
        OS index of the NUMA node the main thread runs on: the node of the
        CPUs in its affinity; if they span several nodes, the node holding
        most of them (the lowest on a tie) and ``spans_nodes`` is True.
    share : float
        Fraction of the process's resident memory (KiB-weighted) on ``node``;
        NaN if it has no resident pages.
    pages : dict of int to int
        Resident pages per node, ``{node: pages}`` (see :class:`NumaMaps`).
    kib : dict of int to int
        Resident KiB per node.
    cpus : tuple of int
        The main thread's affinity (OS CPU ids) that the topology knows.
    affinity_nodes : dict of int to int
        ``{node: CPUs of the affinity on it}``.
    spans_nodes : bool
        Whether the affinity covers CPUs of more than one node.
    """

    pid: int
    node: int
    share: float
    pages: dict
    kib: dict
    cpus: tuple
    affinity_nodes: dict
    spans_nodes: bool

    def to_dict(self) -> dict:
        """A JSON-able copy (node keys become strings once dumped)."""
        return asdict(self)


def parse_numa_maps(text, page_kib=None) -> NumaMaps:
    """Per-node resident pages of the text of a ``/proc/<pid>/numa_maps`` file.

    Parameters
    ----------
    text : str
        The file's content: one mapping per line, an address in hex, a
        memory policy, then ``key=value`` fields and flags.
    page_kib : int, optional
        Page size (KiB) of lines without ``kernelpagesize_kB`` (kernels before
        3.x did not print it); default: this machine's base page size.

    Returns
    -------
    NumaMaps

    Raises
    ------
    NumaError
        If a non-empty line does not start with a hex address.

    Examples
    --------
    >>> text = '''00400000 default file=/usr/bin/python3 mapped=150 N0=150 kernelpagesize_kB=4
    ... 7f3a40000000 default file=/dev/hugepages/buf huge dirty=3 N1=3 kernelpagesize_kB=2048
    ... 7ffd1c5e0000 default'''
    >>> maps = parse_numa_maps(text)
    >>> maps.pages, maps.kib, maps.huge_pages, maps.empty_mappings
    ({0: 150, 1: 3}, {0: 600, 1: 6144}, {1: 3}, 1)
    """
    if page_kib is None:
        page_kib = os.sysconf("SC_PAGE_SIZE") // 1024
    pages, kib, huge = Counter(), Counter(), Counter()
    mappings = empty = 0
    for number, line in enumerate(str(text).splitlines(), 1):
        tokens = line.split()
        if not tokens:
            continue
        if not _ADDRESS.fullmatch(tokens[0]):
            raise NumaError(f"not numa_maps text: line {number} does not start with an address: {line[:60]!r}")
        mappings += 1
        size, counts, is_huge = page_kib, {}, False
        for token in tokens[2:]:       # tokens[1] is the policy
            if m := _NODE_PAGES.fullmatch(token):
                counts[int(m.group(1))] = counts.get(int(m.group(1)), 0) + int(m.group(2))
            elif m := _PAGE_SIZE.fullmatch(token):
                size = int(m.group(1))
            elif token == "huge":
                is_huge = True
        if not counts:
            empty += 1
        for node, n in counts.items():
            pages[node] += n
            kib[node] += n * size
            if is_huge:
                huge[node] += n
    return NumaMaps(dict(sorted(pages.items())), dict(sorted(kib.items())),
                    dict(sorted(huge.items())), mappings, empty)


def read_numa_maps(pid, proc="/proc") -> NumaMaps:
    """Per-node resident pages of a live process, from ``/proc/<pid>/numa_maps``.

    Parameters
    ----------
    pid : int
    proc : str, default "/proc"
        Where procfs is mounted.

    Raises
    ------
    NumaError
        If the process is gone, the kernel has no NUMA support (no such
        file), or the file cannot be read (another user's process).

    Examples
    --------
    >>> import os
    >>> sum(read_numa_maps(os.getpid()).pages.values()) > 0
    True
    """
    pid = _pid(pid)
    path = os.path.join(proc, str(pid), "numa_maps")
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        gone = not os.path.isdir(os.path.join(proc, str(pid)))
        raise NumaError(f"{path}: no such file ("
                        + ("no process with this pid" if gone else "kernel without NUMA support") + ")",
                        pid) from None
    except PermissionError:
        raise NumaError(f"{path}: permission denied (a process of another user?)", pid) from None
    except ProcessLookupError:
        raise NumaError(f"{path}: the process exited while being read", pid) from None
    except OSError as exc:
        raise NumaError(f"{path}: cannot read ({exc.strerror or exc})", pid) from None
    return parse_numa_maps(text)


def locality(pid, node) -> float:
    """Fraction of a process's resident memory (KiB-weighted) on NUMA node ``node``.

    Parameters
    ----------
    pid : int
    node : int
        OS index of the NUMA node.

    Returns
    -------
    float
        Between 0 and 1; NaN if the process has no resident pages.

    Examples
    --------
    >>> import os
    >>> # skipped: the answer is this machine's
    >>> locality(os.getpid(), 0)         # doctest: +SKIP
    1.0
    """
    return read_numa_maps(pid).share(node)


def worker_locality(pid, topology=None) -> Locality:
    """NUMA locality of a worker process: its memory on the node its main thread runs on.

    The main thread's node comes from its CPU affinity
    (``os.sched_getaffinity(pid)``) and the topology's NUMA nodes
    (:meth:`~tuna_lab.machine.topology.Topology.numa_nodes`, OS indexes as in
    numa_maps).

    Parameters
    ----------
    pid : int
        The worker's pid (= its main thread's TID).
    topology : Topology or str, optional
        The live machine (or anything :func:`~tuna_lab.machine.topology_from`
        takes); affinity CPUs it does not know are left out.
        Default: :meth:`Topology.from_sysfs` restricted to the affinity.

    Returns
    -------
    Locality

    Raises
    ------
    NumaError
        If the process is gone or its numa_maps cannot be read.
    TopologyError
        If none of the affinity's CPUs is in ``topology``.

    Examples
    --------
    >>> import os
    >>> loc = worker_locality(os.getpid())
    >>> loc.node in loc.pages, 0 < loc.share <= 1
    (True, True)
    """
    pid = _pid(pid)
    try:
        affinity = sorted(os.sched_getaffinity(pid))
    except ProcessLookupError:
        raise NumaError(f"no process with pid {pid}", pid) from None
    except PermissionError:
        raise NumaError(f"may not read the CPU affinity of pid {pid}", pid) from None
    if topology is None:
        from .topology import Topology

        topology = Topology.from_sysfs(allowed=affinity)
    else:
        from .spec import topology_from

        topology = topology_from(topology)
    cpus = np.asarray(topology.cpus)
    in_topology = set(topology.cpus)
    known = [c for c in affinity if c in in_topology]
    if not known:
        raise TopologyError(f"{topology.name}: none of the CPUs {affinity} that pid {pid} may run on "
                            "is in this topology")
    nodes = topology.numa_os_index[np.searchsorted(cpus, known)].tolist()
    counts = Counter(nodes)
    node = min(counts, key=lambda n: (-counts[n], n))
    maps = read_numa_maps(pid)
    return Locality(pid, int(node), maps.share(node), maps.pages, maps.kib, tuple(known),
                    dict(sorted(counts.items())), len(counts) > 1)


def _pid(pid):
    if isinstance(pid, bool) or not isinstance(pid, (int, np.integer)) or pid < 1:
        raise NumaError(f"pid must be a positive integer, got {pid!r}")
    return int(pid)
