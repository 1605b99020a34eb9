"""Machine topology: logical and physical cores, packages, NUMA nodes, caches.

A :class:`Topology` holds one label vector per level (which physical core,
package, NUMA node and cache domain each logical core belongs to) and derives
the Tuna cache distance ``d(c, c')`` from them. Its readers each live in a
module of their own - :mod:`~tuna_lab.machine.readers.sysfs` (this machine, or a
Linux filesystem root), :mod:`~tuna_lab.machine.readers.hwloc_xml` and
:mod:`~tuna_lab.machine.readers.synthetic` (hwloc synthetic descriptions and the
named presets) - and are reached through the classmethods
:meth:`Topology.from_sysfs`, :meth:`Topology.from_fsroot`,
:meth:`Topology.from_hwloc_xml`, :meth:`Topology.synthetic` and
:meth:`Topology.preset`, which build the topology with
:meth:`Topology.from_reading`.

An optional cost ``"remote"`` adds a NUMA level above the caches: two cores
that share no cache cost ``"none"`` on the same NUMA node and ``"remote"``
(>= ``"none"``) on different nodes. Without it the distance is the article's.

numpy is this module's only dependency, so that reading this machine and
printing :meth:`Topology.to_dict` (``tuna-lab topology --json``) stays fast:
networkx loads with :meth:`Topology.graph`, the XML parser with
:meth:`Topology.from_hwloc_xml`. The readers return plain data
(:class:`~tuna_lab.machine.readers.Reading`) and never import this module.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .._checks import check_cpus
from ..errors import TopologyError
from .readers import synthetic, sysfs
from .readers import CACHE_LEVELS
from .readers.synthetic import PRESETS

__all__ = ["Topology", "PRESETS", "DEFAULT_COSTS", "CACHE_LEVELS"]

DEFAULT_COSTS = {"same": 1, "L1": 4, "L2": 10, "L3": 50, "L4": 200, "none": 200}

# Costs that are absent unless set; absent, the model is exactly the article's.
# "remote": two cores on different NUMA nodes that share no cache (>= "none").
_OPTIONAL_COSTS = ("remote",)



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
        # The readers bound what they read; this bounds a topology built any other way.
        check_cpus(cpus, self.name)
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

    def with_numa_latency(self, node_ids, matrix) -> "Topology":
        """The same machine with ``costs["remote"]`` set from a NUMA latency matrix.

        The cost is ``costs["none"]`` times the mean ratio of a remote latency
        to its row's local one (hwloc and Linux report relative latencies such
        as 10 local, 21 remote: ratio 2.1), rounded to an integer, over the
        nodes that hold cores of this topology. The topology comes back
        unchanged when the matrix does not cover those nodes, has unusable
        values, gives no remote latency above the local one, when there is a
        single node, or when some cache domain spans several nodes (a remote
        cost would break the ultrametric; see :meth:`levels`).

        Parameters
        ----------
        node_ids : sequence of int
            OS index of the NUMA node of each row (and column) of ``matrix``,
            as in :attr:`numa_os_index`.
        matrix : array-like of shape (n, n), or None
            Relative latencies between those nodes; ``None`` changes nothing.

        Examples
        --------
        >>> topo = Topology.synthetic("numa:2 core:2 pu:1")
        >>> topo.with_numa_latency([0, 1], [[10, 21], [21, 10]]).costs["remote"]
        420
        >>> "remote" in topo.with_numa_latency([0, 1], [[10, 10], [10, 10]]).costs
        False
        """
        if matrix is None or self.numa.max() == 0 or self._numa_split() is not None:
            return self
        pos = {int(n): i for i, n in enumerate(node_ids)}
        used = np.unique(self.numa_os_index).tolist()
        if any(n not in pos for n in used):
            return self
        idx = [pos[n] for n in used]
        try:
            matrix = np.asarray(matrix, dtype=float)[np.ix_(idx, idx)]
        except (TypeError, ValueError, IndexError):
            return self
        remote = _remote_from_latency(matrix, self.costs["none"])
        return self if remote is None else self.with_costs({"remote": remote})

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

    def graph(self) -> "networkx.DiGraph":
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
        import networkx as nx  # only here: it takes longer to import than the rest of tuna_lab.machine

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
    def from_keys(cls, name, cpus, core, package, numa, caches=None, *, numa_os_index=None) -> "Topology":
        """A topology from per-core keys of any hashable type, as a reader finds them.

        Two logical cores belong to the same domain when their keys are equal
        (a sibling list, an XML object's number, an OS node id...); the keys
        become dense integer labels, numbered by first appearance along
        ``cpus``.

        Parameters
        ----------
        name : str
        cpus : sequence of int
            OS ids of the logical cores, strictly ascending.
        core, package, numa : sequence of hashable, one per logical core
        caches : dict of str to sequence of hashable, optional
            ``{"L1": keys, ...}`` for the cache levels present.
        numa_os_index : sequence of int, optional
            As for :class:`Topology`.

        Examples
        --------
        >>> topo = Topology.from_keys("two cores", [0, 1, 2, 3], [(0, 2), (1, 3), (0, 2), (1, 3)],
        ...                           ["p0"] * 4, [None] * 4, {"L3": ["x"] * 4})
        >>> topo.core.tolist(), topo.siblings()
        ([0, 1, 0, 1], [(0, 2), (1, 3)])
        """
        return cls(name, tuple(cpus), _dense_keys(core), _dense_keys(package), _dense_keys(numa),
                   {lv: _dense_keys(keys) for lv, keys in (caches or {}).items()},
                   numa_os_index=numa_os_index)

    @classmethod
    def from_reading(cls, reading) -> "Topology":
        """The topology a reader found (:class:`~tuna_lab.machine.readers.Reading`).

        Its keys become labels as in :meth:`from_keys`; then its NUMA latency
        matrix sets ``costs["remote"]`` (:meth:`with_numa_latency`) and its
        relabelling renames the cores (:meth:`relabel`).

        Examples
        --------
        >>> from tuna_lab.machine.readers import Reading
        >>> Topology.from_reading(Reading("r", (0, 1), core=[0, 0], package=[0, 0], numa=[0, 0],
        ...                               relabel={0: 5, 1: 3})).cpus
        (3, 5)
        """
        topo = cls.from_keys(reading.name, reading.cpus, reading.core, reading.package, reading.numa,
                             reading.caches, numa_os_index=reading.numa_os_index)
        if reading.numa_latency is not None:
            topo = topo.with_numa_latency(*reading.numa_latency)
        return topo if reading.relabel is None else topo.relabel(reading.relabel)

    @classmethod
    def from_sysfs(cls, root=None, allowed=None) -> "Topology":
        """This machine, read from Linux sysfs as hwloc reads it.

        Physical cores are groups of thread siblings; caches come from
        ``cpuN/cache/indexK`` (instruction caches skipped, missing directories
        mean the level is absent); NUMA nodes from ``<root>/../node/nodeN``.
        List and mask files, NUL-padded files and offline CPUs are handled as
        in :meth:`from_fsroot`, which reads a whole filesystem root; this
        machine is the root ``/`` restricted to this process's affinity.
        With several nodes holding cores, ``costs["remote"]`` is set from
        ``nodeN/distance`` (relative latencies, 10 = local): ``"none"`` times
        the mean remote/local ratio, rounded, e.g. 200 * 21/10 = 420 - unless a cache
        domain spans several nodes (sub-NUMA clustering), where it stays unset.
        The reader is :func:`tuna_lab.machine.readers.sysfs.read_sysfs`.

        Parameters
        ----------
        root : str or path, optional
            The sysfs cpu directory, by default ``/sys/devices/system/cpu``.
        allowed : iterable of int, optional
            Logical cores to keep. By default the CPUs this process may run on
            (``os.sched_getaffinity``) when reading the live sysfs, so a
            cpuset-limited container sees only its own cores, and every online
            CPU of the tree for any other ``root``.

        Warns
        -----
        TopologyWarning
            No CPU has any cache information (see :mod:`tuna_lab.machine.readers.sysfs`).

        Examples
        --------
        >>> # skipped: the CPUs are this machine's
        >>> Topology.from_sysfs(allowed={0, 1})  # doctest: +SKIP
        Topology('this machine', C=2, P=2, packages=1, L3 domains=1)
        """
        return cls.from_reading(sysfs.read_sysfs(root, allowed))

    @classmethod
    def from_fsroot(cls, root="/", allowed=None) -> "Topology":
        """The machine of a Linux filesystem root, read as ``lstopo --input root`` reads it.

        ``root`` holds ``sys/devices/system/{cpu,node}`` and, optionally,
        ``proc/`` - a copy of a real machine's files such as hwloc's test
        dumps, or ``"/"`` for this machine (then the same as
        :meth:`from_sysfs`). Only the CPUs that are online and that the
        dump's cgroup cpuset allows (found through its ``proc/self/cgroup``
        or ``proc/self/cpuset`` and its mounts) are kept, as lstopo keeps
        them. The topology is named after the directory (``"this machine"``
        for ``/``). The reader is :func:`tuna_lab.machine.readers.sysfs.read_fsroot`.

        Parameters
        ----------
        root : str or path, default "/"
        allowed : iterable of int, optional
            Logical cores to keep instead of the default (each must be online).

        Warns
        -----
        TopologyWarning
            No CPU has any cache information: every pair of distinct cores is
            at distance ``"none"``.

        Examples
        --------
        >>> # skipped: a dump unpacked from tests/data/hwloc-dumps
        >>> Topology.from_fsroot("hwloc-dumps/16em64t-4s2c2t")  # doctest: +SKIP
        Topology('16em64t-4s2c2t', C=16, P=8, packages=4, L3 domains=4)
        """
        return cls.from_reading(sysfs.read_fsroot(root, allowed))

    @classmethod
    def from_hwloc_xml(cls, path) -> "Topology":
        """A topology from hwloc XML (v1 or v2), e.g. from ``lstopo --of xml``.

        With several NUMA nodes holding cores and a NUMA latency matrix in the
        XML (v2 ``<distances2 type="NUMANode">``, v1 ``<distances>``),
        ``costs["remote"]`` is set as in :meth:`from_sysfs`. The reader is
        :func:`tuna_lab.machine.readers.hwloc_xml.read_hwloc_xml`.

        Parameters
        ----------
        path : str, path or file-like
            A file name, an open file, or the XML text itself (``bytes``, or a
            ``str`` starting with ``"<"``).

        Examples
        --------
        >>> # skipped: an lstopo XML file of your machine
        >>> Topology.from_hwloc_xml("machine.xml")  # from `lstopo machine.xml`  # doctest: +SKIP
        Topology('machine.xml', C=32, P=16, packages=1, L3 domains=1)
        """
        # Imported here: the XML reader and its safe file reading (tempfile, hashlib) are not what
        # reading this machine's sysfs needs (`tuna-lab topology` starts faster without them).
        from .readers import hwloc_xml

        return cls.from_reading(hwloc_xml.read_hwloc_xml(path))

    @classmethod
    def synthetic(cls, spec: str) -> "Topology":
        """A topology from an hwloc synthetic description, numbered as hwloc does.

        Each ``type:arity`` level gives the number of children of every object
        of the level above: types ``package`` (``pack``, ``socket``), ``numa``
        (``node``, ``numanode``), ``l4``..``l1`` (``l3cache``, ``l1d``, ``l2u``;
        ``l1i`` instruction caches are accepted and ignored), ``core`` and a
        final ``pu``. Attributes in parentheses are ignored, except a PU list
        ``pu:2(indexes=0,2,1,3)`` which sets the OS ids as hwloc does.
        Without ``core`` each PU is its own physical core. The reader is
        :func:`tuna_lab.machine.readers.synthetic.read_synthetic`.

        Examples
        --------
        >>> topo = Topology.synthetic("pack:2 l3:1(size=32MB) core:2 pu:2")
        >>> topo.package.tolist(), topo.core.tolist()
        ([0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 2, 2, 3, 3])
        """
        return cls.from_reading(synthetic.read_synthetic(spec))

    @classmethod
    def preset(cls, name: str) -> "Topology":
        """A named machine from :data:`PRESETS`, with Linux-style SMT numbering.

        Logical cores ``x`` and ``x + P`` are the two hyperthreads of physical
        core ``x``. The reader is :func:`tuna_lab.machine.readers.synthetic.read_preset`.

        Examples
        --------
        >>> topo = Topology.preset("epyc-7313p")
        >>> topo.distance()[0, [16, 1, 4]].tolist()  # sibling, same CCD, other CCD
        [4.0, 50.0, 200.0]
        """
        return cls.from_reading(synthetic.read_preset(name))


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
