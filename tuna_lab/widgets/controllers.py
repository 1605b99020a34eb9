"""Plain controllers behind the widgets: state and logic, no ipywidgets.

Each controller holds the inputs of one widget, recomputes its outputs when
an input changes and never raises on bad input: a refused change sets
``.error`` to one line and leaves the previous state whole, so a view can
always redraw from a consistent state. Views register a callback with
:meth:`subscribe` and are called after every change, accepted or refused.

Tests and notebooks drive these classes directly; :mod:`tuna_lab.widgets.views`
only forwards widget events to them and redraws. :class:`LiveExperiment`
lives in :mod:`tuna_lab.widgets.live` (threads and servers) and is
re-exported here.

Examples
--------
>>> ex = ModeExplorer("xeon-8272cl", workers=4, threads=8)
>>> ex.toggle_mode(), ex.mode, ex.mapping.f_mode < 0
(True, 'compact', True)
>>> ex.set_topology("pack:2 core:zz pu:2"), ex.error is not None, ex.topology.name
(False, True, 'xeon-8272cl')
"""

import numbers
import reprlib
from types import MappingProxyType

import networkx as nx
import numpy as np
import pandas as pd

from .._checks import iterable
from ..errors import ModelError
from ..machine import PRESETS, THIS_MACHINE, Topology, topology_from
from ..model import DEFAULT_FAMILIES, TunaModel, solve
from ..model.families import resolve_family
from ..model.instance import MODES
from ..model import modes
from ._base import Controller, SizedController, TimedController, checked_time_limit
from .live import LiveExperiment
from ..model.modes import EXAMPLE

__all__ = ["ModeExplorer", "DistanceView", "ConstraintToggles", "PolicyComparison", "LiveExperiment",
           "core_grid", "topology_from", "TOPOLOGY_CHOICES", "compared_policies"]

#: What a topology box offers; any synthetic spec or hwloc XML text is accepted too.
TOPOLOGY_CHOICES = (THIS_MACHINE, *PRESETS)


def compared_policies():
    """The policies :class:`PolicyComparison` shows by default: every registered one that pins threads.

    Read from the registry at each call, so a policy added with
    :func:`tuna_lab.placement.register` is compared with the rest; ``cfs``
    pins nothing, so it has no placement to draw.

    Examples
    --------
    >>> compared_policies()
    ('round-robin', 'omp-spread', 'omp-close', 'numa', 'tuna-scatter', 'tuna-compact')
    """
    from ..placement.plan import PinnedBy
    from ..placement.policies import registered_policies

    return tuple(p.name for p in registered_policies() if p.pinned_by is not PinnedBy.NONE)


def _checked_bool(name, value):
    """``value`` as a bool, or :class:`ModelError`: ``"yes"`` or ``None`` for a switch is a slip, not a wish."""
    if not isinstance(value, (bool, np.bool_)):
        raise ModelError(f"{name} must be True or False, got {value!r}")
    return bool(value)


# -- the machine drawn as a grid of cores -------------------------------------------

def _domain_labels(topo):
    """The cache domain each logical core is drawn in: the outermost cache level (or package)."""
    level = next((lv for lv in ("L4", "L3", "L2", "L1") if lv in topo.caches), None)
    labels = topo.caches[level] if level else topo.package
    names = np.array([f"{level or 'package'} #{k}" for k in labels.tolist()], dtype=object)
    if level and topo.package.max() > 0:
        names = np.array([f"pkg {p} · {n}" for p, n in zip(topo.package.tolist(), names)], dtype=object)
    return labels, names


def core_grid(topology, mapping=None):
    """One row per logical core of ``topology``, in drawing order, with ``mapping``'s threads on it.

    Parameters
    ----------
    topology : Topology, preset name or spec
    mapping : Mapping or array of int (W, T), optional
        The threads to place (OS cpu ids, column 0 = main threads).

    Returns
    -------
    pandas.DataFrame
        ``cpu``, ``physical_core``, ``sibling`` (SMT index in its core),
        ``package``, ``numa``, one column per cache level (``L1``.. domain
        labels), ``domain`` (the cache domain it is drawn in), ``column``
        (the physical core's place in drawing order: grouped by domain),
        then ``load``, ``workers`` (worker of each thread on it), ``threads``
        (``"w.t"`` labels), ``mains`` and ``main``.

    Examples
    --------
    >>> g = core_grid(Topology.synthetic("l3:2 core:1 pu:2"), [[0, 3]])
    >>> g[["cpu", "domain", "column", "load", "main"]].values.tolist()
    [[0, 'L3 #0', 0, 1, True], [1, 'L3 #0', 0, 0, False], [2, 'L3 #1', 1, 0, False], [3, 'L3 #1', 1, 1, False]]
    """
    topo = topology_from(topology)
    cpus = np.asarray(topo.cpus)
    domain_key, domain = _domain_labels(topo)
    frame = pd.DataFrame({"cpu": cpus, "physical_core": topo.core, "package": topo.package, "numa": topo.numa,
                          **{lv: labels for lv, labels in topo.caches.items()}, "domain": domain})
    frame["sibling"] = frame.groupby("physical_core").cumcount()
    # Physical cores ordered by domain, then by their lowest cpu; SMT siblings share a column.
    by_core = frame.groupby("physical_core")
    cores = pd.DataFrame({"domain": pd.Series(domain_key).groupby(frame["physical_core"]).first(),
                          "low": by_core["cpu"].min()}).sort_values(["domain", "low"])
    frame["column"] = frame["physical_core"].map(dict(zip(cores.index, range(len(cores)))))

    assign = np.zeros((0, 0), dtype=int) if mapping is None else \
        np.asarray(getattr(mapping, "assignment", mapping), dtype=int)
    W, T = assign.shape
    on = {c: [] for c in cpus.tolist()}
    for w in range(W):
        for t in range(T):
            on.setdefault(int(assign[w, t]), []).append((w, t))
    frame["load"] = [len(on[c]) for c in cpus.tolist()]
    frame["workers"] = [tuple(w for w, _ in on[c]) for c in cpus.tolist()]
    frame["threads"] = [tuple(f"{w}.{t}" for w, t in on[c]) for c in cpus.tolist()]
    frame["mains"] = [sum(t == 0 for _, t in on[c]) for c in cpus.tolist()]
    frame["main"] = frame["mains"] > 0
    front = ["cpu", "physical_core", "sibling", "package", "numa", *topo.caches, "domain", "column"]
    return frame[front + ["load", "workers", "threads", "mains", "main"]]


# -- ModeExplorer ---------------------------------------------------------------------

class ModeExplorer(SizedController):
    """The Tuna mapping of ``workers`` x ``threads`` in both modes, re-solved on every change.

    It opens on an example where scatter and compact differ visibly
    (:data:`~tuna_lab.model.modes.EXAMPLE`: ``epyc-7313p``, 4 x 4, where
    scatter spreads a worker over four L3s and compact packs it into one), and
    says in one line what the toggle changes - or, where nothing can differ,
    why and which change would make it (:meth:`difference`).

    Parameters
    ----------
    topology : Topology or str
        Anything :func:`topology_from` reads (``"this machine"`` reads this one).
    workers, threads : int
    mode : {"scatter", "compact"}
    physical : bool
        Whether the physical-core analogues (8+) and (11+-12+) are in the model
        (:meth:`toggle_physical`).
    time_limit : float
        Seconds the solver may take per mapping (the article's sizes take
        milliseconds; a big preset may stop at the limit with a gap).

    Raises
    ------
    TunaError
        From the constructor, for bad initial inputs, and from assigning an
        input (``ex.workers = 0``) that its ``set_*`` method refuses; the
        ``set_*`` methods set ``.error`` instead and return False.

    Attributes
    ----------
    topology, workers, threads, mode, physical, time_limit
        The inputs: assigning one re-solves (or raises what refused it;
        ``time_limit`` must be a positive number of seconds).
    mapping : Mapping
        The solution in ``mode``.
    other : Mapping
        The solution in the other mode (same inputs otherwise).
    scatter, compact : Mapping
        The two solutions by mode (each is ``mapping`` or ``other``).
    error : str or None
        Why the last change was refused (read-only, as every output is).

    Examples
    --------
    >>> ex = ModeExplorer("xeon-8272cl", workers=2, threads=2)
    >>> ex.set_workers(0), ex.error, ex.workers
    (False, 'workers must be a positive integer, got 0', 2)
    >>> ex.grid().query("main")["cpu"].tolist()
    [0, 1]
    >>> ex.workers = 4; ex.threads = 4; ex.mapping.workers
    4
    >>> print(ex.why_same().split(", and")[0])
    with the physical-core balance (8+) on, W x T = 16 <= P = 16 gives every thread a physical core of its own
    >>> ex.toggle_physical(), ex.why_same()
    (True, None)
    """

    _inputs = {**SizedController._inputs, "mode": "set_mode", "physical": "set_physical",
               "time_limit": "set_time_limit"}
    _outputs = ("mapping", "other", "scatter", "compact")

    def __init__(self, topology=EXAMPLE["topology"], workers=EXAMPLE["workers"], threads=EXAMPLE["threads"],
                 mode="scatter", physical=True, *, time_limit=10.0):
        super().__init__()
        self._solve(topology_from(topology), workers, threads, mode, physical, time_limit)
        self._seal()

    def _solve(self, topology, workers, threads, mode, physical, time_limit):
        time_limit = checked_time_limit(time_limit)
        if mode not in MODES:
            raise ModelError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        physical = _checked_bool("physical", physical)
        fams = modes.families(physical)
        mapping, other = (solve(workers, threads, topology, m, families=fams, time_limit=time_limit)
                          for m in (mode, MODES[1 - MODES.index(mode)]))
        self.topology, self.mode, self.physical, self.time_limit = topology, mode, physical, time_limit
        self.workers, self.threads = mapping.workers, mapping.threads   # ints, even from numpy
        # What difference() and physical_effect() said, kept until the next change (they solve more).
        self.mapping, self.other, self._said, self._physical_said = mapping, other, None, None
        self.scatter, self.compact = (mapping, other) if mode == "scatter" else (other, mapping)

    def _change(self, **changes):
        def compute():
            new = {k: changes.get(k, getattr(self, k)) for k in self._inputs}
            self._solve(topology_from(new["topology"]), new["workers"], new["threads"], new["mode"], new["physical"],
                        new["time_limit"])
        return self._attempt(compute)

    def set_mode(self, mode):
        """Solve in ``mode`` (``"scatter"`` or ``"compact"``); False and ``.error`` if refused."""
        return self._change(mode=mode)

    def toggle_mode(self):
        """Switch scatter <-> compact."""
        return self.set_mode(MODES[1 - MODES.index(self.mode)])

    def set_physical(self, on):
        """Put the physical-core analogues (8+), (11+-12+) in (True) or out of the model; False if refused."""
        return self._change(physical=on)

    def toggle_physical(self):
        """Switch the physical-core analogues on <-> off (see :meth:`physical_effect` for what they change)."""
        return self.set_physical(not self.physical)

    def differ(self):
        """Whether scatter and compact place the threads of a worker at a different total distance."""
        return modes.differ(self.scatter, self.compact)

    def why_same(self):
        """Why scatter and compact give the same mapping here, in one line naming the change that separates
        them; ``None`` where they differ (see :func:`~tuna_lab.model.modes.why_same`)."""
        return modes.why_same(self.scatter, self.compact, self.physical, min(self.time_limit, 5.0))

    def difference(self):
        """One line: what the mode toggle changes here, or why it changes nothing and what would.

        Examples
        --------
        >>> print(ModeExplorer().difference())
        scatter and compact differ: 12 of 16 threads sit on other cores; a worker spans 4 L3 domains in scatter, 1 in compact; f_mode +4800 vs -1200
        """
        if self._said is None:
            self._said = modes.difference(self.scatter, self.compact, self.physical,
                                                         min(self.time_limit, 5.0))
        return self._said

    def moved(self):
        """Threads on another core in the other mode: ``worker``, ``thread``, ``role``, ``scatter_cpu``, ``compact_cpu``."""
        s, c = self.scatter.assignment, self.compact.assignment
        w, t = np.nonzero(s != c)
        return pd.DataFrame({"worker": w, "thread": t, "role": np.where(t == 0, "main", "openmp"),
                             "scatter_cpu": s[w, t], "compact_cpu": c[w, t]})

    def compare(self):
        """The objective terms of both modes side by side: one row per worker's f_mode term, then
        ``f_mode``, ``f_main`` and ``objective``; columns ``scatter`` and ``compact``.

        Examples
        --------
        >>> ModeExplorer().compare().loc[["f_mode", "f_main"]].values.tolist()
        [[4800.0, -1200.0], [1200.0, 1200.0]]
        """
        rows = [f"worker {w}" for w in range(self.workers)] + ["f_mode", "f_main", "objective"]
        cols = {}
        for name, m in (("scatter", self.scatter), ("compact", self.compact)):
            cols[name] = [*modes.worker_terms(m).tolist(), m.f_mode, m.f_main, m.objective]
        return pd.DataFrame(cols, index=pd.Index(rows, name="term"))

    def pair_distances(self, worker=0):
        """``worker``'s threads in both modes: mode -> DataFrame of the cache distance between each two.

        Rows and columns are labelled ``"t<k> @ cpu <c>"``; the upper triangle sums to
        the worker's term of ``|f_mode|`` (see :meth:`compare`).
        """
        if not isinstance(worker, (int, np.integer)) or not 0 <= worker < self.workers:
            raise ModelError(f"worker must be 0..{self.workers - 1}, got {worker!r}")
        out = {}
        for name, m in (("scatter", self.scatter), ("compact", self.compact)):
            pos = m.positions[worker]
            labels = [f"t{t} @ cpu {c}" for t, c in enumerate(m.assignment[worker].tolist())]
            d = m.instance.distance[np.ix_(pos, pos)].copy()
            np.fill_diagonal(d, 0)
            out[name] = pd.DataFrame(d, index=labels, columns=labels)
        return out

    def physical_effect(self):
        """One line: what the physical-core analogues change in each mode, the current one marked
        (solves both modes with the other setting, once per change).

        On the default screen (scatter) they change nothing, in compact they
        keep a worker's threads off each other's physical core: a line about
        the current mode alone said "nothing" where the toggle matters.

        Examples
        --------
        >>> print(ModeExplorer("xeon-8272cl", 4, 4).physical_effect().split(": ", 1)[1].split(";")[0])
        in scatter (shown) they change nothing (1..1 threads per physical core with them or without)
        """
        if self._physical_said is None:
            fams = modes.families(not self.physical)
            flipped = [solve(self.workers, self.threads, self.topology, mode, families=fams,
                             time_limit=self.time_limit) for mode in MODES]
            current = [self.mapping if mode == self.mode else self.other for mode in MODES]
            pair = (current, flipped) if self.physical else (flipped, current)
            self._physical_said = modes.physical_effect(*pair, shown=self.mode)
        return self._physical_said

    def grid(self):
        """The current mapping on the machine, one row per logical core (see :func:`core_grid`)."""
        return core_grid(self.topology, self.mapping)

    def threads_frame(self):
        """One row per thread (the mapping's :meth:`~tuna_lab.model.Mapping.to_frame`)."""
        return self.mapping.to_frame()

    def table(self):
        """The assignment as a table: one row per worker, one column per thread (``main`` first).

        Examples
        --------
        >>> ModeExplorer("xeon-8272cl", 2, 3).table().columns.tolist()
        ['main', 't1', 't2']
        """
        cols = ["main"] + [f"t{t}" for t in range(1, self.threads)]
        return pd.DataFrame(self.mapping.assignment, columns=cols,
                            index=pd.RangeIndex(self.workers, name="worker"))

    def terms(self):
        """The objective terms and the solver's verdict, as a dict."""
        m = self.mapping
        return {"mode": self.mode, "f_main": m.f_main, "f_mode": m.f_mode, "objective": m.objective,
                "status": m.status, "proven_optimal": bool(m.proven_optimal)}

    def summary(self):
        """Two deterministic lines (no timings): the instance and the objective terms.

        Examples
        --------
        >>> print(ModeExplorer("xeon-8272cl", 4, 8).summary().splitlines()[1])
        scatter: f_main=300 f_mode=5600 objective=5900; physical loads 2..2; optimal (proven)
        """
        m, t = self.mapping, self.terms()
        phys = m.physical_loads
        proof = "proven" if t["proven_optimal"] else f"gap {m.gap:.2%}" if m.gap is not None else "not proven"
        return (f"{m.instance.describe()}\n"
                f"{self.mode}: f_main={t['f_main']:g} f_mode={t['f_mode']:g} objective={t['objective']:g}; "
                f"physical loads {phys.min()}..{phys.max()}; {m.status} ({proof})")

    def figure(self):
        """The mapping drawn on the machine (plotly), the threads the other mode moves ringed."""
        from . import figures

        moved = self.moved()
        title = f"{self.topology.name}: W={self.workers} x T={self.threads}, {self.mode}"
        return figures.mapping_figure(self.grid(), self.threads_frame(), title,
                                      list(zip(moved["worker"], moved["thread"])))

    def distance_figure(self, worker=0):
        """:meth:`pair_distances` drawn side by side (plotly): how far apart each mode puts one worker's threads."""
        from . import figures

        return figures.pair_distance_figure(self.pair_distances(worker),
                                            f"worker {worker}: cache distance between each two of its threads")

    def _repr_state(self):
        m = self.mapping
        return [*super()._repr_state(), f"f_mode={m.f_mode:g}", f"objective={m.objective:g}", f"status={m.status!r}"]


# -- DistanceView -------------------------------------------------------------------

def _tree_positions(graph, root=("machine", 0)):
    """Tidy tree layout: leaves in depth-first order along x, parents centred over children, y = -depth."""
    depth = nx.shortest_path_length(graph, root)
    x, leaves = {}, 0
    for node in nx.dfs_postorder_nodes(graph, root, sort_neighbors=sorted):
        children = list(graph.successors(node))
        if children:
            x[node] = float(np.mean([x[c] for c in children]))
        else:
            x[node], leaves = float(leaves), leaves + 1
    return {node: (x[node], -float(depth[node])) for node in x}


class DistanceView(Controller):
    """The cache distance matrix, which cache level each pair shares, and the topology tree.

    Parameters
    ----------
    topology : Topology, str or None
        Anything :func:`topology_from` reads.
    cpus : iterable of int or Mapping, optional
        Logical cores to highlight (a mapping highlights the cpus it uses).

    Attributes
    ----------
    topology, highlighted
        The inputs: assigning one goes through :meth:`set_topology` or
        :meth:`highlight` (and raises what they refuse).
    distance : pandas.DataFrame
        ``d(c, c')`` indexed by cpu on both axes.
    level : pandas.DataFrame
        The closest cache level each pair shares: ``"same"``, ``"L1"``..``"L4"``, ``"none"``, or
        ``"remote"`` (different NUMA nodes, when the topology has a remote cost).
    graph : networkx.DiGraph
        :meth:`Topology.graph`; ``positions`` maps its nodes to ``(x, y)``.

    Examples
    --------
    >>> dv = DistanceView("epyc-7313p", cpus=[0, 1])
    >>> dv.level.loc[0, [0, 16, 1, 4]].tolist()
    ['same', 'L1', 'L3', 'none']
    >>> dv.nodes().query("highlighted")["label"].tolist()
    ['cpu 0', 'cpu 1']
    """

    _inputs = {"topology": "set_topology", "highlighted": "highlight"}
    _outputs = ("distance", "level", "graph", "positions")

    def __init__(self, topology=None, cpus=()):
        super().__init__()
        self._set(topology_from(topology), cpus)
        self._seal()

    @staticmethod
    def _cpu_ids(cpus):
        """The cpu ids ``cpus`` names (an iterable of ints, or a Mapping's), or :class:`ModelError`."""
        if hasattr(cpus, "assignment"):
            return frozenset(np.ravel(cpus.assignment).tolist())
        if isinstance(cpus, (str, bytes, bytearray)) or not iterable(cpus):
            raise ModelError(f"highlighted: cpu ids (ints) or a Mapping, got {reprlib.repr(cpus)}")
        cpus = list(cpus)
        # int(1.5) would highlight cpu 1, and int("1") guess at a string: only integers name a cpu.
        odd = [c for c in cpus if not isinstance(c, numbers.Integral) or isinstance(c, (bool, np.bool_))]
        if odd:
            raise ModelError(f"highlighted: cpu ids (ints) or a Mapping, got {reprlib.repr(odd[0])} "
                             f"in {reprlib.repr(cpus)}")
        return frozenset(int(c) for c in cpus)

    def _set(self, topology, cpus):
        cpus = self._cpu_ids(cpus)
        ids = list(topology.cpus)
        level = np.full((len(ids),) * 2, "none", dtype=object)
        # Outermost level first, so that a closer shared level overwrites it (as Topology.distance does).
        for lv in sorted(topology.caches, reverse=True):
            labels = topology.caches[lv]
            level[labels[:, None] == labels[None, :]] = lv
        # With a remote-NUMA cost, cores on different nodes that share no cache cost more than "none".
        distance = topology.distance()
        level[(level == "none") & (distance > topology.costs["none"])] = "remote"
        np.fill_diagonal(level, "same")
        graph = topology.graph()
        positions = _tree_positions(graph)
        self.topology, self.highlighted = topology, cpus & set(ids)
        self.distance = pd.DataFrame(distance, index=pd.Index(ids, name="cpu"), columns=ids)
        self.level = pd.DataFrame(level, index=pd.Index(ids, name="cpu"), columns=ids)
        self.graph, self.positions = graph, positions

    def set_topology(self, spec):
        """Show another machine (keeps the highlighted cpus it has)."""
        return self._attempt(lambda: self._set(topology_from(spec), self.highlighted))

    def highlight(self, cpus):
        """Highlight these cpus (an iterable of int ids); ids not in the topology are ignored.

        A Mapping highlights the cpus it uses, on its own topology. Anything
        else (``None``, ``5``, ``"abc"``, ``[1.5]``) is refused: False, and
        ``.error`` says what it takes.
        """
        return self._attempt(lambda: self._set(getattr(cpus, "topology", self.topology), cpus))

    def nodes(self):
        """One row per tree node: ``node``, ``kind``, ``label``, ``cpus``, ``x``, ``y``, ``highlighted``."""
        rows = []
        for node, data in self.graph.nodes(data=True):
            kind, index = node
            label = f"cpu {index}" if kind == "pu" else f"{kind} #{index}" if kind != "machine" else "machine"
            x, y = self.positions[node]
            rows.append({"node": node, "kind": kind, "label": label, "cpus": data["cpus"], "x": x, "y": y,
                         "highlighted": kind == "pu" and index in self.highlighted})
        return pd.DataFrame(rows).sort_values(["y", "x"], ascending=[False, True], ignore_index=True)

    def edges(self):
        """``(parent, child)`` node pairs of the tree."""
        return list(self.graph.edges())

    def figure(self, kind="matrix"):
        """The distance matrix (``kind="matrix"``, a heatmap) or the topology tree (``"tree"``), as plotly.

        Examples
        --------
        >>> [t.type for t in DistanceView("epyc-7313p").figure().data]
        ['heatmap']
        """
        from . import figures

        if kind == "matrix":
            return figures.distance_figure(self.distance, self.level, f"{self.topology.name}: cache distance d(c, c')")
        if kind == "tree":
            return figures.tree_figure(self.nodes(), self.edges(), title=self.topology.name)
        raise ModelError(f"kind must be 'matrix' or 'tree', got {kind!r}")

    def _repr_state(self):
        return [f"topology={self.topology.name!r}", f"highlighted={sorted(self.highlighted)}",
                f"levels={sorted(set(self.level.values.ravel()) - {'same'})}"]


# -- ConstraintToggles ----------------------------------------------------------------

class ConstraintToggles(TimedController):
    """Switch constraint families on and off and see what the mapping does without them.

    Parameters
    ----------
    workers, threads : int
    topology : Topology, str or None
    mode : {"scatter", "compact"}
    time_limit : float
        Seconds the solver may take per toggle.

    Attributes
    ----------
    time_limit : float
        The one input besides the toggles: assigning it re-solves both mappings
        (or raises what :meth:`set_time_limit` refused).
    enabled : dict of str to bool
        Family key -> whether it is in the model.
    reference : Mapping
        The solution with every family.
    mapping : Mapping
        The solution with the enabled families.
    changed : pandas.DataFrame
        Threads whose core differs from ``reference``: ``worker``, ``thread``,
        ``role``, ``reference_cpu``, ``cpu``.
    violations : list of Violation
        What *every* default family's check finds wrong with ``mapping`` -
        the dropped families included, which is the point.

    Examples
    --------
    >>> ct = ConstraintToggles(12, 6, "xeon-8272cl")
    >>> ct.toggle("8"), ct.error
    (False, 'family (11-12) needs (8) in the same model')
    >>> ct.toggle("11-12"), ct.violated()
    (True, ('11-12',))
    >>> ct.changed.columns.tolist()       # how many threads move is the solver's choice among equals
    ['worker', 'thread', 'role', 'reference_cpu', 'cpu']
    """

    # No setters for the instance: a new instance is a new ConstraintToggles (the reference is re-solved).
    _inputs = {"time_limit": "set_time_limit"}
    _outputs = ("workers", "threads", "topology", "mode", "families", "enabled", "reference", "mapping",
                "changed", "violations")
    _fixed = ("set_enabled() or toggle() put a family in or out; another instance is a new "
              "ConstraintToggles(workers, threads, topology, mode)")

    def __init__(self, workers, threads, topology=None, mode="scatter", *, time_limit=10.0):
        super().__init__()
        self.topology = topology_from(topology)
        self.time_limit = checked_time_limit(time_limit)
        self.families = DEFAULT_FAMILIES
        reference = TunaModel(workers, threads, self.topology, mode).solve(time_limit=self.time_limit)
        self.workers, self.threads, self.mode = reference.workers, reference.threads, mode
        self._commit(reference, reference, {f.key: True for f in self.families})
        self._seal()

    def _key(self, family):
        return resolve_family(family, self.families).key

    def _solve(self, enabled, time_limit):
        """The mapping with the ``enabled`` families, solved within ``time_limit`` seconds."""
        families = [f for f in self.families if enabled[f.key]]
        model = TunaModel(self.workers, self.threads, self.topology, self.mode, families=families)
        return model.solve(time_limit=time_limit)

    def _change(self, time_limit):
        """Re-solve the reference and the current mapping within ``time_limit`` seconds (see :meth:`set_time_limit`)."""
        def compute():
            limit = checked_time_limit(time_limit)
            reference = TunaModel(self.workers, self.threads, self.topology, self.mode).solve(time_limit=limit)
            mapping = reference if all(self.enabled.values()) else self._solve(self.enabled, limit)
            self._commit(reference, mapping, self.enabled)
            self.time_limit = limit
        return self._attempt(compute)

    def _commit(self, reference, mapping, enabled):
        ref, cur = reference.assignment, mapping.assignment
        w, t = np.nonzero(ref != cur)
        self.changed = pd.DataFrame({"worker": w, "thread": t, "role": np.where(t == 0, "main", "openmp"),
                                     "reference_cpu": ref[w, t], "cpu": cur[w, t]})
        self.violations = mapping.verify(DEFAULT_FAMILIES)
        # Read-only: a family goes in or out through set_enabled, which re-solves.
        self.reference, self.mapping, self.enabled = reference, mapping, MappingProxyType(dict(enabled))

    def set_enabled(self, family, on=True):
        """Put ``family`` (key, equation number or class name) in or out of the model and re-solve.

        A refused toggle (a family another one needs, an infeasible model, a
        solver without a solution, an ``on`` that is not True or False) sets
        ``.error`` and changes nothing.
        """
        def compute():
            enabled = dict(self.enabled)
            enabled[self._key(family)] = _checked_bool("on", on)
            self._commit(self.reference, self._solve(enabled, self.time_limit), enabled)
        return self._attempt(compute)

    def toggle(self, family):
        """Flip ``family`` (see :meth:`set_enabled`)."""
        try:
            on = not self.enabled[self._key(family)]
        except ModelError:
            on = True           # an unknown family goes through set_enabled too, which reports it in .error
        return self.set_enabled(family, on)

    def violated(self):
        """Keys of the families whose checks ``mapping`` violates, in family order."""
        hit = {v.family for v in self.violations}
        return tuple(f.key for f in self.families if f.key in hit)

    def table(self):
        """One row per family: key, equations, name, kind, description, latex, note, active, enabled."""
        inst = self.mapping.instance
        return pd.DataFrame([{
            "key": f.key, "equations": ", ".join(f"({e})" for e in f.equations), "name": f.name,
            "kind": f.kind, "description": f.description, "latex": f.latex, "note": f.note(inst),
            "active": bool(f.active(inst)), "enabled": self.enabled[f.key]} for f in self.families])

    def grid(self):
        """The current mapping on the machine (see :func:`core_grid`)."""
        return core_grid(self.topology, self.mapping)

    def figure(self):
        """The current mapping drawn on the machine (plotly), the threads the dropped families moved ringed."""
        from . import figures

        title = f"{self.topology.name}: W={self.workers} x T={self.threads}, {self.mode}"
        return figures.mapping_figure(self.grid(), self.mapping.to_frame(), title,
                                      list(zip(self.changed["worker"], self.changed["thread"])))

    def _repr_state(self):
        dropped = [k for k, on in self.enabled.items() if not on]
        return [f"workers={self.workers}", f"threads={self.threads}", f"topology={self.topology.name!r}",
                f"mode={self.mode!r}", f"without={dropped}", f"violated={list(self.violated())}",
                f"moved={len(self.changed)}"]


# -- PolicyComparison --------------------------------------------------------------

def _policy_names(policies):
    """``policies`` as a tuple of names (``None``: :func:`compared_policies`), or :class:`ModelError`."""
    if policies is None:
        return compared_policies()
    if isinstance(policies, str):
        policies = [policies]
    elif isinstance(policies, (bytes, bytearray)) or not iterable(policies):
        raise ModelError(f"policies: policy names (str), got {reprlib.repr(policies)}")
    policies = tuple(policies)
    odd = [p for p in policies if not isinstance(p, str)]
    if odd:
        raise ModelError(f"policies: policy names (str), got {reprlib.repr(odd[0])} among them")
    if not policies:
        raise ModelError("policies: name at least one policy to compare")
    return policies


class PolicyComparison(SizedController):
    """The placements of several policies side by side, with the expected load of every core.

    Parameters
    ----------
    workers, threads : int
    topology : Topology, str or None
    policies : sequence of str, optional
        Default :func:`compared_policies`: every registered policy that pins.
    time_limit : float
        Seconds the ``tuna-*`` policies may give the solver.

    Attributes
    ----------
    placements : dict of str to Placement
        One entry per policy.
    topology, workers, threads, policies, time_limit
        The inputs: assigning one recomputes (or raises what refused it:
        ``policies`` are names, ``time_limit`` a positive number of seconds).
    loads : pandas.DataFrame
        Expected threads per logical core (index ``cpu``), one column per policy;
        each column sums to ``workers * threads``.

    Examples
    --------
    >>> pc = PolicyComparison(4, 4, "xeon-8272cl")
    >>> pc.loads.sum().tolist()
    [16.0, 16.0, 16.0, 16.0, 16.0, 16.0]
    >>> float(pc.loads["omp-close"].max())   # every worker on the same 4 physical cores
    2.0
    """

    _inputs = {**SizedController._inputs, "policies": "set_policies", "time_limit": "set_time_limit"}
    _outputs = ("placements", "loads")

    def __init__(self, workers, threads, topology=None, policies=None, *, time_limit=10.0):
        super().__init__()
        self._compute(workers, threads, topology_from(topology), policies, time_limit)
        self._seal()

    def _compute(self, workers, threads, topology, policies, time_limit):
        from ..placement.policies import compare, placement

        time_limit = checked_time_limit(time_limit)
        policies = _policy_names(policies)
        placements = {p: placement(p, workers, threads, topology, time_limit=time_limit) for p in policies}
        summary = compare(workers, threads, topology, policies, time_limit=time_limit)
        loads = pd.DataFrame({p: pl.expected_loads() for p, pl in placements.items()},
                             index=pd.Index(topology.cpus, name="cpu"))
        self.placements, self._summary, self.loads = placements, summary, loads
        self.workers, self.threads, self.topology, self.policies = int(workers), int(threads), topology, policies
        self.time_limit = time_limit

    def _change(self, **changes):
        def compute():
            self._compute(changes.get("workers", self.workers), changes.get("threads", self.threads),
                          topology_from(changes.get("topology", self.topology)),
                          changes.get("policies", self.policies), changes.get("time_limit", self.time_limit))
        return self._attempt(compute)

    def set_policies(self, policies):
        """Compare these policies (names; ``None``: :func:`compared_policies`); False and ``.error`` if refused."""
        return self._change(policies=policies)

    def summary(self):
        """:func:`tuna_lab.placement.compare` of the policies: one row per policy."""
        return self._summary

    def figure(self):
        """The expected loads as a heatmap (plotly): one row per policy, one column per logical core."""
        from . import figures

        return figures.loads_figure(self.frame())

    def frame(self):
        """Tidy loads for drawing: ``policy``, ``cpu``, ``physical_core``, ``column``, ``sibling``, ``load``."""
        grid = core_grid(self.topology)[["cpu", "physical_core", "column", "sibling"]]
        long = self.loads.reset_index().melt(id_vars="cpu", var_name="policy", value_name="load")
        return long.merge(grid, on="cpu")[["policy", "cpu", "physical_core", "column", "sibling", "load"]]
