"""Machine topology: logical and physical cores, packages, NUMA nodes, caches.

A :class:`Topology` holds one label vector per level (which physical core,
package, NUMA node and cache domain each logical core belongs to) and derives
the Tuna cache distance ``d(c, c')`` from them. It is read from this machine's
sysfs, hwloc XML, an hwloc synthetic description, or a named preset.

An optional cost ``"remote"`` adds a NUMA level above the caches: two cores
that share no cache cost ``"none"`` on the same NUMA node and ``"remote"``
(>= ``"none"``) on different nodes. Without it the distance is the article's.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import numbers
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx
import numpy as np

from tuna_lab.errors import TopologyError

__all__ = ["Topology", "PRESETS", "DEFAULT_COSTS"]

DEFAULT_COSTS = {"same": 1, "L1": 4, "L2": 10, "L3": 50, "L4": 200, "none": 200}

# Costs that are absent unless set; absent, the model is exactly the article's.
# "remote": two cores on different NUMA nodes that share no cache (>= "none").
_OPTIONAL_COSTS = ("remote",)

CACHE_LEVELS = ("L1", "L2", "L3", "L4")

PRESETS = {
    "xeon-8272cl": "Azure D32ds_v4 (Tuna article): 1 socket, 16 cores, 2-way SMT, "
    "private L1/L2, one shared L3; C=32",
    "xeon-8260-2s": "2 sockets x 24 cores x 2-way SMT, private L1/L2, L3 and NUMA node "
    "per socket; C=96",
    "epyc-7313p": "1 socket, 4 CCDs x 4 cores x 2-way SMT, private L1/L2, L3 per CCD; C=32",
    "epyc-9654": "1 socket, 12 CCDs x 8 cores x 2-way SMT, private L1/L2, L3 per CCD; C=192",
    "epyc-9654-2s": "2 x epyc-9654, NUMA node per socket; C=384",
}

# Each preset is a synthetic spec (hwloc numbers its PUs core by core) renumbered
# the way Linux usually numbers SMT siblings: physical core x owns cpus x, x+P, ...
_PRESET_SPECS = {
    "xeon-8272cl": "pack:1 l3:1 l2:16 l1:1 core:1 pu:2",
    "xeon-8260-2s": "pack:2 numa:1 l3:1 l2:24 l1:1 core:1 pu:2",
    "epyc-7313p": "pack:1 l3:4 l2:4 l1:1 core:1 pu:2",
    "epyc-9654": "pack:1 l3:12 l2:8 l1:1 core:1 pu:2",
    "epyc-9654-2s": "pack:2 numa:1 l3:12 l2:8 l1:1 core:1 pu:2",
}

_SYSFS_CPU = "/sys/devices/system/cpu"

_MAX_SYNTHETIC_PUS = 1 << 16  # more is surely a typo, and would allocate huge arrays

# Position of each non-NUMA synthetic level from the top; levels must appear in
# this order. NUMA nodes may sit anywhere above the PUs (per package, per L3,
# or above the packages), as on real machines.
_SYNTHETIC_RANK = {"package": 0, "L4": 1, "L3": 2, "L2": 3, "L1": 4, "core": 5, "pu": 6}

_SYNTHETIC_LEVEL = re.compile(r"\s*([A-Za-z][A-Za-z0-9]*):(\d+)(?:\(([^()]*)\))?(?=\s|$)")
_CACHE_WORD = re.compile(r"l([1-4])([dui]?)(?:cache)?")
_ALIASES = {**dict.fromkeys(("package", "pack", "socket"), "package"),
            **dict.fromkeys(("numa", "node", "numanode"), "numa"), "core": "core", "pu": "pu"}


@dataclass(frozen=True, eq=False)
class Topology:
    """A machine's logical cores and the domains (core, package, NUMA, caches) they share.

    Every array is indexed by position: entry ``i`` describes logical core
    ``cpus[i]``. Labels are dense integers numbered by first appearance along
    ``cpus``; the constructor re-densifies whatever labels it is given.

    Parameters
    ----------
    name : str
        Where the topology came from ("this machine", a preset, a file name...).
    cpus : tuple of int
        OS ids of the logical cores, strictly ascending.
    core, package, numa : ndarray of int, shape (C,)
        Physical core, package and NUMA node of each logical core.
    caches : dict of str to ndarray
        ``{"L1": labels, ...}`` for the data/unified cache levels present.
    costs : dict, optional
        Cycle costs, merged with :data:`DEFAULT_COSTS`; may add ``"remote"``,
        the cost of two cores on different NUMA nodes (see :meth:`distance`).
    numa_os_index : ndarray of int, shape (C,), optional
        OS index of each logical core's NUMA node (the ``k`` of
        ``/sys/devices/system/node/node<k>`` and of ``N<k>=`` in
        ``/proc/<pid>/numa_maps``); must group the cores as ``numa`` does.
        By default the dense ``numa`` labels stand in (as for synthetic
        machines, whose nodes hwloc numbers 0..).

    Examples
    --------
    >>> topo = Topology.preset("xeon-8272cl")
    >>> topo
    Topology('xeon-8272cl', C=32, P=16, packages=1, L3 domains=1)
    >>> topo.siblings()[0]
    (0, 16)
    """

    name: str
    cpus: tuple[int, ...]
    core: np.ndarray
    package: np.ndarray
    numa: np.ndarray
    caches: dict = field(default_factory=dict)
    costs: dict = field(default_factory=lambda: dict(DEFAULT_COSTS))
    numa_os_index: np.ndarray = None

    def __post_init__(self):
        cpus = tuple(int(c) for c in self.cpus)
        if not cpus:
            raise TopologyError(f"{self.name}: a topology needs at least one logical core")
        if min(cpus) < 0 or any(a >= b for a, b in zip(cpus, cpus[1:])):
            raise TopologyError(f"{self.name}: cpus must be distinct non-negative ids in ascending order")
        caches = dict(self.caches or {})
        unknown = set(caches) - set(CACHE_LEVELS)
        if unknown:
            raise TopologyError(f"{self.name}: unknown cache levels {sorted(unknown)}; use {list(CACHE_LEVELS)}")
        # The dataclass is frozen: normalise through object.__setattr__.
        object.__setattr__(self, "cpus", cpus)
        for attr in ("core", "package", "numa"):
            object.__setattr__(self, attr, _labels(getattr(self, attr), len(cpus), f"{self.name}: {attr}"))
        object.__setattr__(self, "caches", {lv: _labels(caches[lv], len(cpus), f"{self.name}: {lv}")
                                            for lv in CACHE_LEVELS if lv in caches})
        object.__setattr__(self, "costs", _merge_costs(DEFAULT_COSTS, self.costs))
        object.__setattr__(self, "numa_os_index", self._checked_numa_os_index())

    def _checked_numa_os_index(self):
        """``numa_os_index`` validated (one id per NUMA label), or the labels themselves."""
        if self.numa_os_index is None:
            return self.numa
        try:
            ids = np.asarray(self.numa_os_index)
            ok = ids.shape == (self.n_logical,) and ids.dtype.kind in "iu" and ids.min() >= 0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise TopologyError(f"{self.name}: numa_os_index must be {self.n_logical} "
                                "non-negative integers, one per logical core")
        n_pairs = np.unique(np.stack([self.numa, ids]), axis=1).shape[1]
        if not n_pairs == self.numa.max() + 1 == np.unique(ids).size:
            raise TopologyError(f"{self.name}: numa_os_index must give one OS id to each NUMA node")
        ids = ids.astype(np.int64)
        ids.setflags(write=False)
        return ids

    # ------------------------------------------------------------------ sizes
    @property
    def n_logical(self) -> int:
        """Number of logical cores ``C``."""
        return len(self.cpus)

    @property
    def n_physical(self) -> int:
        """Number of physical cores ``P``."""
        return int(self.core.max()) + 1

    @property
    def smt(self) -> tuple:
        """Number of logical cores of each physical core, in core index order."""
        return tuple(np.bincount(self.core).tolist())

    @property
    def threads_per_core(self) -> int:
        """Largest number of hardware threads of a physical core (1 without SMT)."""
        return max(self.smt)

    def __repr__(self):
        n_l3 = int(self.caches["L3"].max()) + 1 if "L3" in self.caches else 0
        return (f"Topology({self.name!r}, C={self.n_logical}, P={self.n_physical}, "
                f"packages={int(self.package.max()) + 1}, L3 domains={n_l3})")

    # -------------------------------------------------------------- distances
    def distance(self, costs=None) -> np.ndarray:
        """Cache distance matrix ``d`` between logical cores.

        Parameters
        ----------
        costs : dict, optional
            Costs overriding this topology's ``costs`` (validated the same way;
            ``{"remote": None}`` removes the NUMA cost).

        Returns
        -------
        ndarray of float, shape (C, C)
            ``costs["same"]`` on the diagonal; elsewhere the cost of the lowest
            cache level the two cores share, ``costs["none"]`` if they share none.
            With ``costs["remote"]`` set, cores on different NUMA nodes that
            share no cache cost ``costs["remote"]`` instead.

        Examples
        --------
        >>> Topology.synthetic("l3:1 l2:2 core:1 pu:2").distance()
        array([[ 1., 10., 50., 50.],
               [10.,  1., 50., 50.],
               [50., 50.,  1., 10.],
               [50., 50., 10.,  1.]])
        >>> Topology.synthetic("numa:2 core:2 pu:1").distance({"remote": 420})
        array([[  1., 200., 420., 420.],
               [200.,   1., 420., 420.],
               [420., 420.,   1., 200.],
               [420., 420., 200.,   1.]])
        """
        costs = _merge_costs(self.costs, costs)
        d = np.full((self.n_logical, self.n_logical), float(costs["none"]))
        remote = self._remote_cost(costs)
        if remote is not None:
            d[self.numa[:, None] != self.numa[None, :]] = remote
        # Outermost level first, so that a closer shared level overwrites it.
        for level in reversed(CACHE_LEVELS):
            if level in self.caches:
                labels = self.caches[level]
                d[labels[:, None] == labels[None, :]] = costs[level]
        np.fill_diagonal(d, costs["same"])
        return d

    def levels(self, costs=None) -> list:
        """Nested partitions that write the distance as an ultrametric.

        For distinct logical cores ``a, b``, ``d(a, b)`` is the cost of the first
        entry whose labels put ``a`` and ``b`` together, else ``costs["none"]``.
        Neither the identity (same core) nor the top level is included - except
        with the NUMA level (below).

        With ``costs["remote"]`` set above ``costs["none"]`` and several NUMA
        nodes, the NUMA partition follows the cache levels at cost
        ``costs["none"]`` (merged with a cache level that has the same domains),
        and the whole machine closes the list at cost ``costs["remote"]``, so
        every pair is joined by some entry. Otherwise the list is exactly the
        cache levels' and the top cost is ``costs["none"]``.

        Parameters
        ----------
        costs : dict, optional
            Costs overriding this topology's ``costs``.

        Returns
        -------
        list of (float, ndarray)
            ``(cost, labels)``, finest first, costs strictly ascending; cache
            levels are below ``costs["none"]``: identical partitions are merged
            (cheaper cost kept), so are equal costs (coarser partition kept),
            and cache levels costing as much as ``"none"`` are dropped; none of
            this changes ``d``.

        Raises
        ------
        TopologyError
            If a level's domains are not unions of the level below's domains,
            or (with the NUMA level) a cache domain spans several NUMA nodes.

        Examples
        --------
        >>> [(cost, labels.tolist()) for cost, labels in
        ...  Topology.synthetic("l3:1 l2:2 core:1 pu:2").levels()]
        [(10.0, [0, 0, 1, 1]), (50.0, [0, 0, 0, 0])]
        >>> [(cost, labels.tolist()) for cost, labels in
        ...  Topology.synthetic("numa:2 l2:2 core:1 pu:1").levels({"remote": 420})]
        [(10.0, [0, 1, 2, 3]), (200.0, [0, 0, 1, 1]), (420.0, [0, 0, 0, 0])]
        """
        costs = _merge_costs(self.costs, costs)
        chain = []
        below = None
        for level in CACHE_LEVELS:
            if level not in self.caches:
                continue
            labels = self.caches[level]
            if below is not None:
                # Nested iff each lower domain maps into exactly one domain here.
                n_pairs = np.unique(np.stack([below, labels]), axis=1).shape[1]
                if n_pairs != below.max() + 1:
                    raise TopologyError(f"{self.name}: cache domains are not nested: "
                                        f"some {level} domain splits a lower-level domain")
            below = labels
            cost = float(costs[level])
            if cost >= costs["none"]:
                continue
            if chain and (chain[-1][0] == cost or np.array_equal(chain[-1][1], labels)):
                chain[-1] = (chain[-1][0], labels)
            else:
                chain.append((cost, labels))
        remote = self._remote_cost(costs)
        if remote is not None:
            split = self._numa_split()
            if split is not None:
                raise TopologyError(
                    f"{self.name}: NUMA nodes do not nest with the cache domains (some {split} "
                    f"domain spans several NUMA nodes), so a 'remote' cost does not make the "
                    f"distance an ultrametric; leave costs['remote'] unset for this machine")
            # Every cache level is now finer than the nodes; a level with the
            # nodes' own domains already gives their pairs its cheaper cost.
            if not (chain and np.array_equal(chain[-1][1], self.numa)):
                chain.append((float(costs["none"]), self.numa))
            whole = np.zeros(self.n_logical, dtype=np.int64)
            whole.setflags(write=False)
            chain.append((float(remote), whole))
        return chain

    def is_ultrametric(self, costs=None) -> bool:
        """Whether ``d(a, c) <= max(d(a, b), d(b, c))`` for all logical cores.

        It holds whenever the cache domains nest (see :meth:`levels`) - and,
        with a ``"remote"`` cost, lie within the NUMA nodes - which is what
        the model's fast encoding relies on.

        Examples
        --------
        >>> Topology.preset("epyc-7313p").is_ultrametric()
        True
        """
        d = self.distance(costs)
        # One pivot b at a time keeps memory at O(C^2) instead of O(C^3).
        return all(np.all(d <= np.maximum(d[:, b, None], d[None, b, :]))
                   for b in range(self.n_logical))

    def _remote_cost(self, costs):
        """``costs["remote"]`` when it changes ``d`` (above "none", several nodes), else None."""
        remote = costs.get("remote")
        if remote is None or remote <= costs["none"] or self.numa.max() == 0:
            return None
        return float(remote)

    def _numa_split(self):
        """The first cache level with a domain spanning several NUMA nodes, or None."""
        for level, labels in self.caches.items():
            n_pairs = np.unique(np.stack([labels, self.numa]), axis=1).shape[1]
            if n_pairs != labels.max() + 1:
                return level
        return None

    def with_costs(self, costs) -> "Topology":
        """The same machine with some costs changed (``{"remote": None}`` removes the NUMA cost).

        Examples
        --------
        >>> topo = Topology.preset("xeon-8260-2s").with_costs({"remote": 420})
        >>> topo.distance()[0, [1, 24]].tolist()  # same socket, other socket
        [50.0, 420.0]
        >>> topo.with_costs({"remote": None}).costs == DEFAULT_COSTS
        True
        """
        return dataclasses.replace(self, costs=_merge_costs(self.costs, costs))

    def numa_nodes(self) -> dict:
        """OS ids of the logical cores of each NUMA node, keyed by the node's OS index.

        Examples
        --------
        >>> Topology.synthetic("numa:2 core:2 pu:1").numa_nodes()
        {0: (0, 1), 1: (2, 3)}
        """
        cpus = np.asarray(self.cpus)
        return {int(node): tuple(cpus[self.numa_os_index == node].tolist())
                for node in np.unique(self.numa_os_index)}

    # ------------------------------------------------------------- structure
    def siblings(self) -> list:
        """OS ids of the logical cores of each physical core, in core index order.

        Examples
        --------
        >>> Topology.synthetic("core:2 pu:2").siblings()
        [(0, 1), (2, 3)]
        """
        cpus = np.asarray(self.cpus)
        return [tuple(cpus[self.core == k].tolist()) for k in range(self.n_physical)]

    def graph(self) -> nx.DiGraph:
        """The hierarchy as a directed graph, from ``("machine", 0)`` down to ``("pu", id)``.

        Levels go machine, package, numa, L4, L3, L2, L1, core, pu, except that
        levels with fewer domains are put higher (one NUMA node above two
        packages, NUMA nodes below an L3 they split), so the graph is a tree
        whenever the domains nest. Absent cache levels are skipped. Each node
        has attributes ``kind``, ``index`` (dense label; the OS id for a PU)
        and ``cpus`` (sorted OS ids below it).

        Examples
        --------
        >>> g = Topology.synthetic("pack:2 core:1 pu:2").graph()
        >>> list(g.successors(("package", 1)))
        [('core', 1)]
        >>> g.nodes[("core", 1)]["cpus"]
        (2, 3)
        """
        kinds = [("package", self.package), ("numa", self.numa)]
        kinds += [(lv, self.caches[lv]) for lv in reversed(CACHE_LEVELS) if lv in self.caches]
        kinds.append(("core", self.core))
        # Stable sort: coarsest first, ties keep the canonical order above.
        kinds.sort(key=lambda kind: int(kind[1].max()))
        cpus = np.asarray(self.cpus)
        kinds = [("machine", np.zeros_like(cpus))] + kinds + [("pu", cpus)]
        g = nx.DiGraph()
        for kind, labels in kinds:
            for index in np.unique(labels).tolist():
                g.add_node((kind, index), kind=kind, index=index,
                           cpus=tuple(cpus[labels == index].tolist()))
        for (up, up_labels), (down, down_labels) in zip(kinds, kinds[1:]):
            pairs = np.unique(np.stack([up_labels, down_labels]), axis=1).T.tolist()
            g.add_edges_from(((up, a), (down, b)) for a, b in pairs)
        return g

    # ---------------------------------------------------------- derivations
    def relabel(self, perm) -> "Topology":
        """The same machine with OS ids renamed through ``perm``.

        Parameters
        ----------
        perm : mapping of int to int
            ``{old_id: new_id}`` for every logical core; new ids must be
            distinct and non-negative (usually a permutation of ``cpus``).

        Examples
        --------
        >>> Topology.synthetic("core:2 pu:2").relabel({0: 0, 1: 2, 2: 1, 3: 3}).siblings()
        [(0, 2), (1, 3)]
        """
        if set(perm) != set(self.cpus):
            raise TopologyError(f"{self.name}: relabel needs one new id for each of the "
                                f"{self.n_logical} logical cores, keyed by their current ids")
        new_ids = [perm[c] for c in self.cpus]
        if len(set(new_ids)) != len(new_ids):
            raise TopologyError(f"{self.name}: relabel maps two logical cores to the same id")
        return self._reordered(self.name, new_ids, slice(None))

    def restrict(self, cpus) -> "Topology":
        """The sub-machine made of the given OS ids (labels re-densified).

        Examples
        --------
        >>> Topology.preset("xeon-8272cl").restrict([0, 1, 16])
        Topology('xeon-8272cl', C=3, P=2, packages=1, L3 domains=1)
        """
        keep = sorted({int(c) for c in cpus})
        missing = set(keep) - set(self.cpus)
        if missing:
            raise TopologyError(f"{self.name}: cannot restrict to unknown logical cores {sorted(missing)}")
        index = np.searchsorted(self.cpus, keep)
        return self._reordered(self.name, keep, index)

    def _reordered(self, name, ids, index):
        """Topology of the rows ``index`` renamed to ``ids`` (sorted, so cpus stays ascending)."""
        order = np.argsort(ids, kind="stable")
        pick = np.arange(self.n_logical)[index][order]
        return type(self)(name, tuple(np.asarray(ids)[order].tolist()), self.core[pick],
                        self.package[pick], self.numa[pick],
                        {lv: labels[pick] for lv, labels in self.caches.items()}, self.costs,
                        self.numa_os_index[pick])

    def to_dict(self) -> dict:
        """A JSON-able description, distance matrix included.

        Examples
        --------
        >>> import json
        >>> json.loads(json.dumps(Topology.synthetic("core:2 pu:1").to_dict()))["distance"]
        [[1.0, 200.0], [200.0, 1.0]]
        """
        return {
            "name": self.name,
            "logical_cores": list(self.cpus),
            "physical_core": self.core.tolist(),
            "package": self.package.tolist(),
            "numa": self.numa.tolist(),
            "numa_os_index": self.numa_os_index.tolist(),
            "caches": {lv: labels.tolist() for lv, labels in self.caches.items()},
            "distance": self.distance().tolist(),
            "costs": dict(self.costs),
            "n_logical": self.n_logical,
            "n_physical": self.n_physical,
            "threads_per_core": self.threads_per_core,
        }

    # ---------------------------------------------------------- constructors
    @classmethod
    def from_sysfs(cls, root=_SYSFS_CPU, allowed=None) -> "Topology":
        """This machine, read from Linux sysfs.

        Physical cores are groups of thread siblings; caches come from
        ``cpuN/cache/indexK`` (instruction caches skipped, missing directories
        mean the level is absent); NUMA nodes from ``<root>/../node/nodeN/cpulist``.
        With several nodes holding cores, ``costs["remote"]`` is set from
        ``nodeN/distance`` (relative latencies, 10 = local): ``"none"`` times
        the mean remote/local ratio, rounded, e.g. 200 * 21/10 = 420 - unless a cache
        domain spans several nodes (sub-NUMA clustering), where it stays unset.

        Parameters
        ----------
        root : str or path, default "/sys/devices/system/cpu"
        allowed : iterable of int, optional
            Logical cores to keep. By default the CPUs this process may run on
            (``os.sched_getaffinity``) when reading the live sysfs, so a
            cpuset-limited container sees only its own cores, and every online
            CPU of the tree for any other ``root``.

        Examples
        --------
        >>> Topology.from_sysfs(allowed={0, 1})  # doctest: +SKIP
        Topology('this machine', C=2, P=2, packages=1, L3 domains=1)
        """
        root = Path(root)
        if not root.is_dir():
            raise TopologyError(f"no sysfs cpu directory at {root}")
        present = sorted(int(m.group(1)) for p in root.iterdir()
                         if (m := re.fullmatch(r"cpu(\d+)", p.name)))
        online = _read(root / "online")
        if online is not None:
            present = sorted(set(present) & set(_parse_cpulist(online, root / "online")))
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
            keys["core"].append(_parse_cpulist(siblings, topo) if siblings
                                else (package, _read(topo / "core_id") or f"cpu{cpu}"))
            keys["package"].append(package)
            shared = {}
            cache_dir = root / f"cpu{cpu}" / "cache"
            for index in sorted(cache_dir.glob("index*")) if cache_dir.is_dir() else ():
                level, kind = _read(index / "level"), _read(index / "type")
                if kind == "Instruction" or level not in ("1", "2", "3", "4"):
                    continue
                cpulist = _read(index / "shared_cpu_list")
                shared[f"L{level}"] = _parse_cpulist(cpulist, index) if cpulist else (cpu,)
            for lv in CACHE_LEVELS:
                # A CPU missing a level others have gets a domain of its own.
                keys[lv].append(shared.get(lv, ("missing", cpu)))
        caches = {lv: _dense_keys(keys[lv]) for lv in CACHE_LEVELS
                  if any(k[0] != "missing" for k in keys[lv])}

        node_of, rows = {}, {}
        node_root = root.parent / "node"
        if node_root.is_dir():
            for node in node_root.iterdir():
                if (m := re.fullmatch(r"node(\d+)", node.name)) and (text := _read(node / "cpulist")):
                    node_of.update(dict.fromkeys(_parse_cpulist(text, node / "cpulist"), int(m.group(1))))
                    rows[int(m.group(1))] = (_read(node / "distance") or "").split()
        numa_ids = [node_of.get(cpu, -1) for cpu in present]
        topo = cls("this machine", tuple(present), _dense_keys(keys["core"]),
                   _dense_keys(keys["package"]), _dense_keys(numa_ids), caches,
                   numa_os_index=None if -1 in numa_ids else numa_ids)
        # nodeN/distance lists N's distance to every online node, in id order.
        online = _read(node_root / "online")
        columns = sorted(_parse_cpulist(online, node_root / "online") if online else rows)
        matrix = [rows[n] for n in columns if n in rows]
        if len(matrix) != len(columns) or any(len(row) != len(columns) for row in matrix):
            matrix = None
        return _with_remote(topo, columns, matrix)

    @classmethod
    def from_hwloc_xml(cls, path) -> "Topology":
        """A topology from hwloc XML (v1 or v2), e.g. from ``lstopo --of xml``.

        With several NUMA nodes holding cores and a NUMA latency matrix in the
        XML (v2 ``<distances2 type="NUMANode">``, v1 ``<distances>``),
        ``costs["remote"]`` is set as in :meth:`from_sysfs`.

        Parameters
        ----------
        path : str, path or file-like
            A file name, an open file, or the XML text itself (``bytes``, or a
            ``str`` starting with ``"<"``).

        Examples
        --------
        >>> Topology.from_hwloc_xml("machine.xml")  # from `lstopo machine.xml`  # doctest: +SKIP
        Topology('machine.xml', C=32, P=16, packages=1, L3 domains=1)
        """
        if isinstance(path, bytes) or (isinstance(path, str) and path.lstrip().startswith("<")):
            name, source = "hwloc XML", io.BytesIO(path.encode() if isinstance(path, str) else path)
        elif hasattr(path, "read"):
            name, source = Path(str(getattr(path, "name", "hwloc XML"))).name, path
        else:
            name, source = Path(path).name, path
        try:
            root = ET.parse(source).getroot()
        except ET.ParseError as exc:
            raise TopologyError(f"{name}: malformed hwloc XML ({exc})") from None
        except OSError as exc:
            raise TopologyError(f"{name}: cannot read hwloc XML ({exc.strerror or exc})") from None
        if root.tag != "topology":
            raise TopologyError(f"{name}: not hwloc XML (root element <{root.tag}>, expected <topology>)")

        pus = []  # (os_index, {kind: key}) for every PU, in document order
        counter = itertools.count()  # unique keys for the objects met

        def walk(obj, ctx):
            kind = obj.get("type", "")
            ctx = dict(ctx)
            if kind in ("Package", "Socket"):
                ctx["package"] = next(counter)
            elif kind == "NUMANode":  # hwloc v1: NUMA nodes are ordinary parents
                ctx["numa"] = obj.get("os_index", next(counter))
            elif kind == "Core":
                ctx["core"] = next(counter)
            elif (level := _xml_cache_level(obj)) is not None:
                ctx[level] = next(counter)
            elif kind == "PU":
                if obj.get("os_index") is None or not obj.get("os_index").isdigit():
                    raise TopologyError(f"{name}: PU without a valid os_index")
                pus.append((int(obj.get("os_index")), ctx))
                return
            # hwloc v2: NUMA nodes hang below the object whose CPUs they serve.
            memory = _xml_numa_child(obj)
            if memory is not None:
                ctx["numa"] = memory
            for child in obj.iterfind("object"):
                walk(child, ctx)

        for top in root.iterfind("object"):
            walk(top, {})
        if not pus:
            raise TopologyError(f"{name}: no PU objects in hwloc XML")
        ids = [pu for pu, _ in pus]
        if len(set(ids)) != len(ids):
            raise TopologyError(f"{name}: duplicate PU os_index in hwloc XML")
        order = np.argsort(ids)
        ctxs = [pus[i][1] for i in order]
        # PUs without a Core parent are each their own physical core.
        labels = {kind: _dense_keys([c.get(kind, ("own", n)) for n, c in enumerate(ctxs)])
                  for kind in ("core", *CACHE_LEVELS)}
        caches = {lv: labels[lv] for lv in CACHE_LEVELS if any(lv in c for c in ctxs)}
        nodes = [c.get("numa") for c in ctxs]
        os_ids = None
        if all(isinstance(n, str) and n.isdigit() for n in nodes):
            os_ids = [int(n) for n in nodes]
        topo = cls(name, tuple(sorted(ids)), labels["core"],
                   _dense_keys([c.get("package") for c in ctxs]), _dense_keys(nodes), caches,
                   numa_os_index=os_ids)
        if os_ids is None:
            return topo
        return _with_remote(topo, *_xml_numa_latency(root))

    @classmethod
    def synthetic(cls, spec: str) -> "Topology":
        """A topology from an hwloc synthetic description, numbered as hwloc does.

        Each ``type:arity`` level gives the number of children of every object
        of the level above: types ``package`` (``pack``, ``socket``), ``numa``
        (``node``, ``numanode``), ``l4``..``l1`` (``l3cache``, ``l1d``, ``l2u``;
        ``l1i`` instruction caches are accepted and ignored), ``core`` and a
        final ``pu``. Attributes in parentheses are ignored, except a PU list
        ``pu:2(indexes=0,2,1,3)`` which sets the OS ids as hwloc does.
        Without ``core`` each PU is its own physical core.

        Examples
        --------
        >>> topo = Topology.synthetic("pack:2 l3:1(size=32MB) core:2 pu:2")
        >>> topo.package.tolist(), topo.core.tolist()
        ([0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 2, 2, 3, 3])
        """
        if not isinstance(spec, str) or not spec.strip():
            raise TopologyError(f"empty synthetic spec {spec!r}")
        levels = _parse_synthetic(spec)
        n_pus = int(np.prod([arity for _, arity, _ in levels]))
        position = np.arange(n_pus)
        labels, above = {}, 1
        for kind, arity, _ in levels[:-1]:
            above *= arity
            if kind is not None:
                labels[kind] = position // (n_pus // above)
        ids = _synthetic_indexes(spec, levels[-1][2], n_pus)
        core = labels.get("core", position)
        zeros = np.zeros(n_pus, dtype=int)
        topo = cls(f"synthetic:{' '.join(spec.split())}", tuple(range(n_pus)), core,
                   labels.get("package", zeros), labels.get("numa", zeros),
                   {lv: labels[lv] for lv in CACHE_LEVELS if lv in labels})
        return topo if ids is None else topo.relabel(dict(enumerate(ids)))

    @classmethod
    def preset(cls, name: str) -> "Topology":
        """A named machine from :data:`PRESETS`, with Linux-style SMT numbering.

        Logical cores ``x`` and ``x + P`` are the two hyperthreads of physical core ``x``.

        Examples
        --------
        >>> topo = Topology.preset("epyc-7313p")
        >>> topo.distance()[0, [16, 1, 4]].tolist()  # sibling, same CCD, other CCD
        [4.0, 50.0, 200.0]
        """
        if name not in _PRESET_SPECS:
            raise TopologyError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
        topo = cls.synthetic(_PRESET_SPECS[name])
        n_phys, smt = topo.n_physical, topo.threads_per_core
        # hwloc numbers PU i as thread i % smt of core i // smt; Linux as core + thread * P.
        i = np.arange(topo.n_logical)
        linux = dict(zip(i.tolist(), (i // smt + (i % smt) * n_phys).tolist()))
        return dataclasses.replace(topo.relabel(linux), name=name)


# ---------------------------------------------------------------- helpers
def _dense(labels):
    """Renumber labels 0.. by order of first appearance."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(first))
    return rank[inverse.ravel()]


def _dense_keys(keys):
    """Dense labels (first appearance) for a list of hashable keys of any type."""
    ids = {}
    return np.array([ids.setdefault(k, len(ids)) for k in keys], dtype=np.int64)


def _labels(values, n, what):
    """Validate one label vector and return it dense and read-only."""
    try:
        arr = np.asarray(values)
        ok = arr.shape == (n,) and (arr.dtype.kind in "iu" or np.array_equal(arr, arr.astype(np.int64)))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise TopologyError(f"{what} labels must be {n} integers, one per logical core")
    arr = _dense(arr.astype(np.int64))
    arr.setflags(write=False)
    return arr


def _merge_costs(base, costs):
    """``base`` updated with ``costs``, checked positive and non-decreasing outwards.

    Optional keys (``"remote"``) may be given as ``None`` to remove them.
    """
    merged = dict(base)
    if costs is not None:
        if not isinstance(costs, Mapping):
            raise TopologyError(f"costs must be a dict, not {type(costs).__name__}")
        unknown = set(costs) - set(DEFAULT_COSTS) - set(_OPTIONAL_COSTS)
        if unknown:
            raise TopologyError(f"unknown cost keys {sorted(unknown)}; valid keys: "
                                f"{', '.join([*DEFAULT_COSTS, *_OPTIONAL_COSTS])}")
        merged.update(costs)
    for key in _OPTIONAL_COSTS:
        if key in merged and merged[key] is None:
            del merged[key]
    for key, value in merged.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                or not np.isfinite(value) or value <= 0:
            raise TopologyError(f"cost {key!r} must be a positive finite number, got {value!r}")
        merged[key] = value if isinstance(value, int) else float(value)
    # Non-decreasing costs make d an ultrametric over nested cache domains;
    # "same" lowest keeps the diagonal below every off-diagonal entry.
    chain = list(DEFAULT_COSTS) + [key for key in _OPTIONAL_COSTS if key in merged]
    for low, high in zip(chain, chain[1:]):
        if merged[low] > merged[high]:
            raise TopologyError(f"costs must be non-decreasing same <= L1 <= L2 <= L3 <= L4 <= none"
                                f"{' <= remote' if 'remote' in merged else ''}, "
                                f"but {low}={merged[low]} > {high}={merged[high]}")
    return merged


def _remote_from_latency(matrix, none_cost):
    """``costs["remote"]`` from a NUMA latency matrix between the nodes holding cores, or None.

    ``none_cost`` times the mean ratio of a remote latency to its row's local
    one (hwloc and Linux report relative latencies such as 10 local, 21 remote:
    ratio 2.1), rounded to an integer. None with fewer than two nodes,
    unusable values, or no remote latency above the local one.
    """
    try:
        m = np.asarray(matrix, dtype=float)
    except (TypeError, ValueError):
        return None
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] < 2 \
            or not np.all(np.isfinite(m)) or np.any(m <= 0):
        return None
    ratio = (m / np.diag(m)[:, None])[~np.eye(m.shape[0], dtype=bool)].mean()
    # An integer keeps objective values on a grid (bounds use the costs' gcd).
    remote = int(round(float(none_cost * ratio)))
    return remote if remote > none_cost else None


def _with_remote(topo, node_ids, matrix):
    """``topo`` with ``costs["remote"]`` from a latency ``matrix`` over OS nodes ``node_ids``.

    Only the nodes that hold cores of ``topo`` count. Unchanged when the matrix
    does not cover them, gives no remote cost, or when some cache domain spans
    several nodes (a remote cost would break the ultrametric; see ``levels``).
    """
    if matrix is None or topo.numa.max() == 0 or topo._numa_split() is not None:
        return topo
    pos = {int(n): i for i, n in enumerate(node_ids)}
    used = np.unique(topo.numa_os_index).tolist()
    if any(n not in pos for n in used):
        return topo
    idx = [pos[n] for n in used]
    try:
        matrix = np.asarray(matrix, dtype=float)[np.ix_(idx, idx)]
    except (TypeError, ValueError, IndexError):
        return topo
    remote = _remote_from_latency(matrix, topo.costs["none"])
    return topo if remote is None else topo.with_costs({"remote": remote})


def _read(path):
    """Stripped text of a small sysfs file, or None if it cannot be read."""
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _parse_cpulist(text, where):
    """Linux cpulist syntax ("0-3,8,10-11") to a tuple of ids."""
    cpus = []
    for item in filter(None, text.strip().split(",")):
        m = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", item)
        if not m or (m.group(2) and int(m.group(2)) < int(m.group(1))):
            raise TopologyError(f"{where}: bad cpulist {text!r}")
        cpus.extend(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return tuple(cpus)


def _xml_cache_level(obj):
    """"L1".."L4" for a data or unified cache object (v1 or v2 XML), else None."""
    kind = obj.get("type", "")
    if obj.get("cache_type") == "2":  # instruction cache
        return None
    m = re.fullmatch(r"L([1-4])Cache", kind)
    if m:
        return f"L{m.group(1)}"
    if kind == "Cache" and obj.get("depth") in ("1", "2", "3", "4"):
        return f"L{obj.get('depth')}"
    return None


def _xml_numa_child(obj):
    """os_index of the first NUMA node attached as a memory child (possibly behind MemCache)."""
    for child in obj.iterfind("object"):
        kind = child.get("type")
        # A v2 memory child is a leaf; a v1 NUMA node with children is handled by walk().
        if kind == "NUMANode" and child.find("object") is None:
            return child.get("os_index", "?")
        if kind == "MemCache" and (found := _xml_numa_child(child)) is not None:
            return found
    return None


def _xml_numa_latency(root):
    """``(node os ids, latency matrix)`` of the first NUMA latency matrix in hwloc XML, or ``((), None)``.

    hwloc v2 writes ``<distances2 type="NUMANode" kind=... indexing="os">`` at
    the top, with ``<indexes>`` and ``<u64values>`` split over several
    elements; v1 writes ``<distances nbobjs=...>`` with ``<latency value=...>``
    children inside the object whose NUMA nodes (in document order) they relate.
    Anything that does not fit is ignored.
    """
    for dist in root.iterfind("distances2"):
        kind = dist.get("kind", "")
        # kind bits (hwloc/distances.h): 4 means latency, 8 bandwidth
        if dist.get("type") != "NUMANode" or (kind.isdigit() and not int(kind) & 4):
            continue
        indexes = " ".join(e.text or "" for e in dist.iterfind("indexes")).split()
        values = " ".join(e.text or "" for e in dist.iterfind("u64values")).split()
        if dist.get("indexing", "os") == "gp":
            gp = {o.get("gp_index"): o.get("os_index") for o in root.iter("object")
                  if o.get("type") == "NUMANode"}
            indexes = [gp.get(i, "?") for i in indexes]
        n = len(indexes)
        if n >= 2 and len(values) == n * n and all(i.isdigit() for i in indexes) \
                and all(v.isdigit() for v in values):
            return [int(i) for i in indexes], np.array(values, dtype=float).reshape(n, n)
    for obj in root.iter("object"):
        for dist in obj.iterfind("distances"):
            nodes = [o.get("os_index", "?") for o in obj.iter("object")
                     if o is not obj and o.get("type") == "NUMANode"]
            values = [v.get("value", "") for v in dist.iterfind("latency")]
            n = len(nodes)
            try:
                matrix = np.array(values, dtype=float).reshape(n, n)
            except ValueError:
                continue
            if n >= 2 and str(n) == dist.get("nbobjs", str(n)) and all(i.isdigit() for i in nodes):
                return [int(i) for i in nodes], matrix
    return (), None


def _parse_synthetic(spec):
    """``[(kind or None, arity, attributes), ...]`` of a synthetic spec, validated."""
    levels, pos, end = [], 0, len(spec.rstrip())
    while pos < end:
        m = _SYNTHETIC_LEVEL.match(spec, pos)
        if not m:
            raise TopologyError(f"synthetic spec {spec!r}: cannot parse at {spec[pos:].strip()!r}")
        word, arity = m.group(1).lower(), int(m.group(2))
        cache = _CACHE_WORD.fullmatch(word)
        if cache:
            kind = None if cache.group(2) == "i" else f"L{cache.group(1)}"  # skip l1i
        elif word in _ALIASES:
            kind = _ALIASES[word]
        else:
            raise TopologyError(f"synthetic spec {spec!r}: unknown type {m.group(1)!r}; use "
                                "package, numa, l4, l3, l2, l1, core, pu")
        if arity < 1:
            raise TopologyError(f"synthetic spec {spec!r}: arity of {m.group(1)!r} must be positive")
        levels.append((kind, arity, m.group(3) or ""))
        pos = m.end()
    kinds = [kind for kind, _, _ in levels if kind is not None]
    if not kinds or kinds[-1] != "pu" or levels[-1][0] != "pu":
        raise TopologyError(f"synthetic spec {spec!r}: the last level must be pu")
    if len(set(kinds)) != len(kinds):
        raise TopologyError(f"synthetic spec {spec!r}: a type appears twice")
    ranked = [k for k in kinds if k != "numa"]
    for upper, lower in zip(ranked, ranked[1:]):
        if _SYNTHETIC_RANK[upper] > _SYNTHETIC_RANK[lower]:
            raise TopologyError(f"synthetic spec {spec!r}: {upper!r} cannot be below {lower!r} "
                                "(order: package, l4, l3, l2, l1, core, pu)")
    n_pus = 1
    for _, arity, _ in levels:
        n_pus *= arity
        if n_pus > _MAX_SYNTHETIC_PUS:
            raise TopologyError(f"synthetic spec {spec!r}: more than {_MAX_SYNTHETIC_PUS} PUs")
    return levels


def _synthetic_indexes(spec, attributes, n_pus):
    """OS ids from a PU level's ``indexes=`` list, or None for hwloc's default 0..C-1."""
    for attribute in attributes.split():
        if attribute.lower().startswith("indexes="):
            value = attribute.split("=", 1)[1]
            if not re.fullmatch(r"\d+(,\d+)*", value):
                raise TopologyError(f"synthetic spec {spec!r}: only explicit PU index lists "
                                    "(indexes=0,2,1,3) are supported")
            ids = [int(x) for x in value.split(",")]
            if len(ids) != n_pus or len(set(ids)) != n_pus:
                raise TopologyError(f"synthetic spec {spec!r}: indexes must list {n_pus} distinct PU ids")
            return ids
    return None
