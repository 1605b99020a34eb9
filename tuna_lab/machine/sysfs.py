"""This machine's topology, read from Linux sysfs (``/sys/devices/system/cpu``).

The reader behind :meth:`Topology.from_sysfs <tuna_lab.machine.topology.Topology.from_sysfs>`.
It reads a few hundred small files and needs nothing but numpy, so that
``tuna-lab topology`` starts fast.

Examples
--------
>>> read_sysfs().n_logical >= 1
True
"""

import os
import re
from pathlib import Path

from .._checks import parse_cpulist
from ..errors import TopologyError
from .topology import CACHE_LEVELS, Topology

__all__ = ["read_sysfs"]

_SYSFS_CPU = "/sys/devices/system/cpu"


def read_sysfs(root=None, allowed=None) -> Topology:
    """This machine (or a copied sysfs tree) as a :class:`~tuna_lab.machine.topology.Topology`.

    Parameters
    ----------
    root : str or path, optional
        The sysfs cpu directory, by default ``/sys/devices/system/cpu``; NUMA
        nodes are read from its sibling ``node`` directory.
    allowed : iterable of int, optional
        Logical cores to keep; by default this process's affinity for the live
        sysfs and every online CPU for any other ``root``. See
        :meth:`Topology.from_sysfs <tuna_lab.machine.topology.Topology.from_sysfs>`.

    Raises
    ------
    TopologyError
        No such directory, no online CPU, an allowed CPU that is not online,
        or a malformed cpulist.

    Examples
    --------
    >>> import os
    >>> set(read_sysfs().cpus) == os.sched_getaffinity(0)
    True
    """
    root = Path(_SYSFS_CPU if root is None else root)
    if not root.is_dir():
        raise TopologyError(f"no sysfs cpu directory at {root}")
    present = _online_cpus(root)
    if allowed is None and root.resolve() == Path(_SYSFS_CPU).resolve():
        allowed = os.sched_getaffinity(0)
    if allowed is not None:
        allowed = {int(c) for c in allowed}
        if allowed - set(present):
            raise TopologyError(f"{root}: allowed CPUs {sorted(allowed - set(present))} are not online")
        present = sorted(allowed)
    if not present:
        raise TopologyError(f"{root}: no online CPU found")

    keys = {"core": [], "package": [], **{lv: [] for lv in CACHE_LEVELS}}
    for cpu in present:
        topo = root / f"cpu{cpu}" / "topology"
        siblings = _read(topo / "core_cpus_list") or _read(topo / "thread_siblings_list")
        package = _read(topo / "physical_package_id") or "0"
        # Without a sibling list, fall back to the (package, core_id) pair.
        keys["core"].append(parse_cpulist(siblings, topo) if siblings
                            else (package, _read(topo / "core_id") or f"cpu{cpu}"))
        keys["package"].append(package)
        shared = _shared_caches(root / f"cpu{cpu}" / "cache", cpu)
        for lv in CACHE_LEVELS:
            # A CPU missing a level others have gets a domain of its own.
            keys[lv].append(shared.get(lv, ("missing", cpu)))
    caches = {lv: keys[lv] for lv in CACHE_LEVELS if any(k[0] != "missing" for k in keys[lv])}

    node_root = root.parent / "node"
    node_of, columns, matrix = _numa_nodes(node_root)
    numa_ids = [node_of.get(cpu, -1) for cpu in present]
    topo = Topology.from_keys("this machine", present, keys["core"], keys["package"], numa_ids, caches,
                              numa_os_index=None if -1 in numa_ids else numa_ids)
    return topo.with_numa_latency(columns, matrix)


def _read(path):
    """Stripped text of a small sysfs file, or None if it cannot be read."""
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _online_cpus(root):
    """Sorted ids of the ``cpuN`` directories under ``root`` that ``root/online`` lists (if present)."""
    present = sorted(int(m.group(1)) for p in root.iterdir() if (m := re.fullmatch(r"cpu(\d+)", p.name)))
    online = _read(root / "online")
    if online is not None:
        present = sorted(set(present) & set(parse_cpulist(online, root / "online")))
    return present


def _shared_caches(cache_dir, cpu):
    """``{"L2": cpu ids sharing it, ...}`` for the data and unified caches of one CPU."""
    shared = {}
    for index in sorted(cache_dir.glob("index*")) if cache_dir.is_dir() else ():
        level, kind = _read(index / "level"), _read(index / "type")
        if kind == "Instruction" or level not in ("1", "2", "3", "4"):
            continue
        cpulist = _read(index / "shared_cpu_list")
        shared[f"L{level}"] = parse_cpulist(cpulist, index) if cpulist else (cpu,)
    return shared


def _numa_nodes(node_root):
    """``(node of each cpu, node ids, distance matrix or None)`` from ``/sys/devices/system/node``."""
    node_of, rows = {}, {}
    if node_root.is_dir():
        for node in node_root.iterdir():
            if (m := re.fullmatch(r"node(\d+)", node.name)) and (text := _read(node / "cpulist")):
                node_of.update(dict.fromkeys(parse_cpulist(text, node / "cpulist"), int(m.group(1))))
                rows[int(m.group(1))] = (_read(node / "distance") or "").split()
    # nodeN/distance lists N's distance to every online node, in id order.
    online = _read(node_root / "online")
    columns = sorted(parse_cpulist(online, node_root / "online") if online else rows)
    matrix = [rows[n] for n in columns if n in rows]
    if len(matrix) != len(columns) or any(len(row) != len(columns) for row in matrix):
        matrix = None
    return node_of, columns, matrix
