"""A Linux machine's topology, read from sysfs the way hwloc reads it.

The readers behind :meth:`Topology.from_fsroot
<tuna_lab.machine.topology.Topology.from_fsroot>` (a whole filesystem root, as
``lstopo --input DIR`` reads one) and :meth:`Topology.from_sysfs
<tuna_lab.machine.topology.Topology.from_sysfs>` (a sysfs cpu directory; by
default this machine, which is the filesystem root ``/`` restricted to this
process's affinity). Both go through one reader:

- CPUs: the online ``cpuN`` directories that have a ``topology`` directory;
  in a dump, only those its cgroup cpuset allows (on the live machine the
  affinity already says so);
- SMT siblings: ``core_cpus`` or ``thread_siblings`` (hex masks, as hwloc
  reads them), else their ``_list`` forms, else one core per CPU; AMD
  compute units (family 15h/16h), whose "siblings" have core ids of their
  own, are one core per CPU as in hwloc;
- packages: ``package_cpus``/``core_siblings`` (masks or lists), else
  ``physical_package_id``;
- caches: each ``cache/indexN`` with its ``level`` and ``type``
  (instruction caches skipped), shared by ``shared_cpu_map`` (else
  ``shared_cpu_list``; an empty map, as on ia64, means the core's CPUs);
- NUMA nodes: ``node/nodeN/cpumap`` (else ``cpulist``) for the nodes
  ``node/online`` lists (else every ``nodeN``), and ``nodeN/distance``.
  Every CPU keeps its node, even one a dump's cpuset ``mems`` exclude
  (lstopo hides those nodes).

Domains are built as hwloc builds its objects, so that inconsistent files
read as lstopo reads them: the set a CPU's file gives makes a domain only
when that CPU is the first online CPU of the set, and the other CPUs join
it. Files may use either format, end in NUL bytes or whitespace. When no CPU
has any cache information the reader still returns the machine, but warns
(:class:`~tuna_lab.errors.TopologyWarning`) that every pair of cores will be
at distance ``"none"``. It reads a few hundred small files with numpy only,
so that ``tuna-lab topology`` starts fast.

Examples
--------
>>> len(read_sysfs().cpus) >= 1
True
>>> read_fsroot("/").cpus == read_sysfs().cpus
True
"""

import os
import re
import warnings
from pathlib import Path

from ..._checks import check_cpus
from ...errors import TopologyError, TopologyWarning
from ..linuxfs import cgroup_cpuset, online_cpus, read_cpulist, read_cpumask, read_text
from . import CACHE_LEVELS, THIS_MACHINE, Reading

__all__ = ["read_sysfs", "read_fsroot"]

_LIVE_ROOT = "/"
_CPU_DIR = "sys/devices/system/cpu"
_NODE_DIR = "sys/devices/system/node"

# Where the kernel states each grouping, in the order tried: hwloc reads the
# masks (a dump may hold a list that disagrees), older kernels have only the
# thread_siblings/core_siblings names, fake trees only the lists.
_CORE_FILES = ("core_cpus", "thread_siblings", "core_cpus_list", "thread_siblings_list")
_PACKAGE_FILES = ("package_cpus", "core_siblings", "package_cpus_list", "core_siblings_list")
_CACHE_FILES = ("shared_cpu_map", "shared_cpu_list")
_NODE_FILES = ("cpumap", "cpulist")


def read_sysfs(root=None, allowed=None) -> Reading:
    """This machine (or a copied sysfs tree) as a :class:`~tuna_lab.machine.readers.Reading`.

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
        or a malformed cpulist or mask.

    Examples
    --------
    >>> import os
    >>> set(read_sysfs().cpus) == os.sched_getaffinity(0)
    True
    """
    cpu_dir = Path(_LIVE_ROOT, _CPU_DIR) if root is None else Path(root)
    live = cpu_dir.resolve() == Path(_LIVE_ROOT, _CPU_DIR).resolve()
    if allowed is None and live:
        allowed = os.sched_getaffinity(0)
    # /proc/cpuinfo (AMD compute units) is found when the tree is a whole root's.
    parts = cpu_dir.resolve().parts
    fsroot = Path(*parts[:-4]) if parts[-4:] == tuple(_CPU_DIR.split("/")) else None
    return _read(THIS_MACHINE, cpu_dir, cpu_dir.parent / "node", fsroot, allowed, strict=True)


def read_fsroot(root="/", allowed=None) -> Reading:
    """The machine whose filesystem root is ``root``, read as ``lstopo --input root`` reads it.

    The :class:`~tuna_lab.machine.readers.Reading` behind
    :meth:`Topology.from_fsroot <tuna_lab.machine.topology.Topology.from_fsroot>`.

    Parameters
    ----------
    root : str or path, default "/"
        A directory holding ``sys/devices/system/{cpu,node}`` and, optionally,
        ``proc/`` (``cpuinfo``, ``self/cgroup``, ``mounts``) and the cgroup
        mounts they name. ``"/"`` is this machine.
    allowed : iterable of int, optional
        Logical cores to keep (each must be online). By default this process's
        affinity for ``"/"``, and for any other root the online CPUs its
        ``proc/self`` cgroup cpuset allows - lstopo's default.

    Raises
    ------
    TopologyError
        No sysfs cpu directory under ``root``, no usable CPU, an ``allowed``
        CPU that is not online, or a malformed file.

    Examples
    --------
    >>> len(read_fsroot("/").cpus) == len(__import__("os").sched_getaffinity(0))
    True
    """
    root = Path(root)
    cpu_dir = root / _CPU_DIR
    live = root.resolve() == Path(_LIVE_ROOT).resolve()
    strict = allowed is not None
    if allowed is None:
        # A dump's cpuset may list CPUs that were offline: lstopo drops them quietly.
        allowed = os.sched_getaffinity(0) if live else cgroup_cpuset(root)
    name = THIS_MACHINE if live else root.resolve().name
    return _read(name, cpu_dir, root / _NODE_DIR, root, allowed, strict)


# ------------------------------------------------------------------ the reader
def _read(name, cpu_dir, node_dir, fsroot, allowed, strict):
    """The topology of the CPUs of ``cpu_dir`` (and nodes of ``node_dir``) that ``allowed`` keeps.

    ``strict``: an allowed CPU that is not online is an error (a user's
    request), else it is dropped (a cpuset naming offline CPUs).
    """
    if not cpu_dir.is_dir():
        raise TopologyError(f"no sysfs cpu directory at {cpu_dir}")
    # hwloc reads the online CPUs the kernel gives topology information for,
    # builds their domains, and only then drops the CPUs the process may not use.
    online = [c for c in online_cpus(cpu_dir) if (cpu_dir / f"cpu{c}" / "topology").is_dir()]
    # Bounded before a file per CPU is read.
    check_cpus(online, str(cpu_dir))
    keep = online
    if allowed is not None:
        allowed = {int(c) for c in allowed}
        if strict and allowed - set(online):
            raise TopologyError(f"{cpu_dir}: allowed CPUs {sorted(allowed - set(online))} are not online")
        keep = sorted(allowed & set(online))
    if not keep:
        raise TopologyError(f"{cpu_dir}: no online CPU found")

    topo_dirs = [cpu_dir / f"cpu{cpu}" / "topology" for cpu in online]
    sibling_sets = [_cpus(d, _CORE_FILES) for d in topo_dirs]
    split = _has_compute_units(fsroot) and _threads_have_core_ids(cpu_dir, online, sibling_sets)
    cores = _domains(online, [(cpu,) for cpu in online] if split else sibling_sets)
    package_sets = [_cpus(d, _PACKAGE_FILES) for d in topo_dirs]
    packages = _domains(online, package_sets) if any(package_sets) else \
        [("id", read_text(d / "physical_package_id")) for d in topo_dirs]
    shared = [_shared_caches(cpu_dir / f"cpu{cpu}" / "cache", siblings)
              for cpu, siblings in zip(online, sibling_sets)]
    caches = {lv: _domains(online, [s.get(lv) for s in shared])
              for lv in CACHE_LEVELS if any(lv in s for s in shared)}
    if not caches:
        warnings.warn(_no_cache_message(name, cpu_dir, fsroot), TopologyWarning, stacklevel=4)

    node_of, columns, matrix = _numa_nodes(node_dir)
    position = {cpu: i for i, cpu in enumerate(online)}
    pick = [position[c] for c in keep]
    numa_ids = [node_of.get(cpu, -1) for cpu in keep]
    return Reading(name, tuple(keep), [cores[i] for i in pick], [packages[i] for i in pick], numa_ids,
                   {lv: [keys[i] for i in pick] for lv, keys in caches.items()},
                   numa_os_index=None if -1 in numa_ids else numa_ids, numa_latency=(columns, matrix))


def _domains(cpus, sets):
    """One key per CPU for a level (core, package, a cache) from the CPU set each CPU's file gives.

    hwloc's rule: CPU ``i``'s set makes a domain when ``i`` is the first of
    its CPUs that are online; each CPU belongs to the domain holding it. A
    set that overlaps an earlier domain is dropped (hwloc cannot insert it),
    and a CPU left in no domain - without the file, or named only by
    inconsistent files - is a domain of its own.
    """
    online = set(cpus)
    owner = {}
    for cpu, found in zip(cpus, sets):
        domain = frozenset(found or ()) & online
        if domain and min(domain) == cpu and not any(c in owner for c in domain):
            owner.update(dict.fromkeys(domain, domain))
    return [owner.get(cpu, ("own", cpu)) for cpu in cpus]


def _cpus(directory, names):
    """The CPU set of the first of ``names`` readable in ``directory`` (masks or ``*list`` files), or None."""
    for file in names:
        path = directory / file
        cpus = read_cpulist(path) if file.endswith("list") else read_cpumask(path)
        if cpus is not None:
            return cpus
    return None


def _has_compute_units(fsroot):
    """Whether ``fsroot``'s /proc/cpuinfo is an AMD family 15h/16h machine (Bulldozer compute units)."""
    text = read_text(Path(fsroot, "proc/cpuinfo")) if fsroot is not None else None
    first = (text or "").split("\n\n")[0].splitlines()
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first)}
    return fields.get("vendor_id") == "AuthenticAMD" and fields.get("cpu family") in ("21", "22")


def _threads_have_core_ids(cpu_dir, cpus, core_sets):
    """Whether thread siblings report different ``core_id`` s: hwloc then makes each one a core.

    AMD compute units pair two cores as "thread siblings"; hwloc tells them
    apart by ``core_id``, deciding once from the first CPU with a sibling.
    """
    for cpu, siblings in zip(cpus, core_sets):
        others = [c for c in siblings or () if c != cpu]
        if others:
            ids = {read_text(cpu_dir / f"cpu{c}" / "topology" / "core_id") for c in (cpu, others[0])}
            return len(ids) > 1
    return False


def _shared_caches(cache_dir, siblings):
    """``{"L2": CPUs sharing it, ...}`` for the data and unified caches of one CPU (``siblings``: its core's)."""
    shared = {}
    for index in sorted(cache_dir.glob("index*")) if cache_dir.is_dir() else ():
        level, kind = read_text(index / "level"), read_text(index / "type")
        if kind == "Instruction" or level not in ("1", "2", "3", "4"):
            continue
        # An empty map (ia64) stands for the core's CPUs, as in hwloc.
        shared[f"L{level}"] = _cpus(index, _CACHE_FILES) or siblings
    return shared


def _numa_nodes(node_dir):
    """``(node of each cpu, node ids, distance matrix or None)`` from a sysfs node directory."""
    ids = read_cpulist(node_dir / "online")
    if ids is None:
        ids = sorted(int(m.group(1)) for p in node_dir.iterdir()
                     if (m := re.fullmatch(r"node(\d+)", p.name))) if node_dir.is_dir() else []
    node_of, rows = {}, {}
    for node in sorted(ids):
        cpus = _cpus(node_dir / f"node{node}", _NODE_FILES) or ()
        # A CPU claimed twice (a buggy firmware table) stays in the first node, as hwloc keeps it.
        node_of.update({c: node for c in cpus if c not in node_of})
        rows[node] = (read_text(node_dir / f"node{node}" / "distance") or "").split()
    # nodeN/distance lists N's distance to every online node, in id order (extra values ignored).
    columns = sorted(ids)
    matrix = [rows[n][:len(columns)] for n in columns]
    if any(len(row) != len(columns) for row in matrix) or not columns:
        matrix = None
    return node_of, columns, matrix


def _no_cache_message(name, cpu_dir, fsroot):
    """The one line that says a machine was read without any cache information, and what is missing."""
    where = f"{cpu_dir}/cpu*/cache"
    also = ""
    if fsroot is not None and Path(fsroot, "proc/device-tree/cpus").is_dir():
        also = " (its caches are described only in proc/device-tree, which is not read)"
    return (f"{name}: no CPU cache information in {where}{also}; "
            f"every pair of distinct cores is at distance 'none'")
