"""Thread placement policies: where each thread of each server worker may run.

A server runs ``W`` worker processes, each with ``T`` OpenMP threads (thread
``0`` is the worker's main thread, which is also the OpenMP initial thread).
A policy turns ``(W, T, topology)`` into a :class:`Placement`: for every
thread, the set of logical cores (OS cpu ids) it is allowed on, plus who
enforces it and the environment the workers need. Each policy is a
:class:`Policy` in a registry: :func:`register` adds one (the CLI, the lab
server, ``run`` and the widgets then offer it), :func:`registered_policies`
lists them. The built-in ones, registered the same way:

================  ==========================================================  ==========
policy            placement                                                   pinned by
================  ==========================================================  ==========
``cfs``           no binding: the kernel's scheduler (CFS/EEVDF) decides      none
``round-robin``   OCC pinning: threads in worker order, ``cpus[k % C]``       tuna_lab
``omp-spread``    ``OMP_PROC_BIND=spread``, same in every worker              openmp
``omp-close``     ``OMP_PROC_BIND=close``, same in every worker               openmp
``numa``          all threads of worker ``w`` on NUMA node ``w % nodes``      tuna_lab
``tuna-scatter``  the Tuna ILP's mapping, scatter mode                        tuna_lab
``tuna-compact``  the Tuna ILP's mapping, compact mode                        tuna_lab
================  ==========================================================  ==========

The OpenMP policies are emulated from GNU libgomp's rules (``team.c``,
``config/linux/affinity.c``), because that is what XGBoost wheels link:

* The *place list* (``OMP_PLACES``) holds only the CPUs the process may use.
  ``threads``: one place per logical cpu; ``cores``: one place per physical
  core, the set of its SMT siblings. Places are ordered by their lowest cpu id.
* The initial thread binds to the first place, and its *place partition* is
  the whole list (``N`` places).
* ``close`` with ``T <= N``: thread ``i`` binds to place ``i``. With
  ``T > N``, ``s = T // N`` consecutive threads fill each place in turn, then
  the last ``T mod N`` threads go one by one to places ``0, 1, ...`` (the
  OpenMP spec asks for consecutive threads per place; libgomp keeps the same
  counts per place but not the consecutive numbering).
* ``spread`` with ``T <= N``: the partition is split into ``T`` contiguous
  subpartitions, the first ``N mod T`` of ``N // T + 1`` places and the others
  of ``N // T``; thread ``i`` binds to the first place of subpartition ``i``.
  With ``T > N`` each place is its own subpartition and threads are placed as
  with ``close``.

Every worker starts from the same place list, so every worker binds the same
way: the article's point about ``OMP_PROC_BIND`` in multi-process servers.

Examples
--------
>>> from tuna_lab import Topology
>>> p = placement("round-robin", 4, 4, Topology.synthetic("core:16 pu:1"))
>>> p.as_array()[:, 0].tolist()  # four main threads, 4 cores apart
[0, 4, 8, 12]
>>> placement("omp-spread", 2, 2, Topology.preset("xeon-8272cl")).describe().splitlines()[2]
'  worker 0: main 0,16 | 0,16 8,24'
"""

from __future__ import annotations

import itertools
import numbers
import re
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from .._checks import check_size, format_cpulist
from ..errors import ModelError, PolicyError, RelaxedMappingWarning, TopologyError
from ..machine import Topology, topology_from
from ..model.families import main_counts, pair_sums, worker_counts
from ..model.instance import MODES
from .plan import PinnedBy

__all__ = ["POLICIES", "Policy", "register", "unregister", "registered_policies", "policy_names", "get_policy",
           "Placement", "placement", "compare"]

_PLACES = ("cores", "threads")
# Names go into comma-separated lists (--policies) and file names: no commas, spaces or slashes.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
# Loads are sums of fractions 1/k: compare them with a little slack.
_EPS = 1e-9


@dataclass(frozen=True, eq=False)
class Placement:
    """Where every thread of every worker may run under one policy.

    Parameters
    ----------
    policy : str
        One of :data:`POLICIES` (or any label, for hand-made placements).
    workers, threads : int
        ``W`` workers with ``T`` threads each; thread 0 is the main thread.
    topology : Topology
        The machine the placement is for.
    allowed : nested sequence of sets of int, shape (W, T)
        ``allowed[w][t]``: OS cpu ids thread ``t`` of worker ``w`` may run on.
        Stored as a tuple of tuples of frozensets.
    env : dict of str to str
        Extra environment for the worker processes (``OMP_*`` for the OpenMP
        policies, empty for the others).
    pinned_by : PinnedBy or {"none", "tuna_lab", "openmp"}
        Who enforces ``allowed``: nobody (the kernel decides), tuna_lab
        (``sched_setaffinity`` on each thread id) or the OpenMP runtime
        (from ``env``; tuna_lab only reads the affinities back). Stored as
        a :class:`~tuna_lab.placement.plan.PinnedBy`.
    mapping : Mapping, optional
        The solved Tuna mapping, for the ``tuna-*`` policies.

    Examples
    --------
    >>> from tuna_lab import Topology
    >>> p = placement("numa", 2, 2, Topology.synthetic("pack:2 numa:1 core:2 pu:1"))
    >>> sorted(p.allowed[1][0]), p.cpu(1, 0), p.expected_loads().tolist()
    ([2, 3], None, [1.0, 1.0, 1.0, 1.0])
    """

    policy: str
    workers: int
    threads: int
    topology: Topology
    allowed: tuple
    env: dict
    pinned_by: PinnedBy
    mapping: object = None

    def __post_init__(self):
        W, T = check_size(self.workers, self.threads, ModelError)
        if not isinstance(self.topology, Topology):
            raise TopologyError(f"topology must be a Topology, got {type(self.topology).__name__}")
        pinned_by = PinnedBy.of(self.pinned_by, ModelError)
        rows = tuple(tuple(s if isinstance(s, frozenset) else frozenset(int(c) for c in s) for s in row)
                     for row in self.allowed)
        if len(rows) != W or any(len(row) != T for row in rows):
            raise ModelError(f"allowed must hold {W} rows of {T} cpu sets, one per thread")
        known = frozenset(self.topology.cpus)
        if not all(s and s <= known for s in set(itertools.chain.from_iterable(rows))):
            raise ModelError("every allowed cpu set must be a non-empty subset of the topology's cpus")
        for name, value in (("workers", W), ("threads", T), ("allowed", rows), ("pinned_by", pinned_by),
                            ("env", {str(k): str(v) for k, v in dict(self.env or {}).items()})):
            object.__setattr__(self, name, value)

    def __repr__(self):
        return (f"Placement({self.policy!r}, W={self.workers}, T={self.threads}, "
                f"topology={self.topology.name!r}, pinned_by={self.pinned_by.value!r})")

    # -- the placement as arrays ------------------------------------------------
    @cached_property
    def _membership(self):
        """Boolean (W, T, C): thread (w, t) may run on logical core position c."""
        cpus = np.asarray(self.topology.cpus)
        # Policies share a handful of distinct sets: build each row once.
        rows = {}
        index = [rows.setdefault(s, len(rows)) for s in itertools.chain.from_iterable(self.allowed)]
        table = np.zeros((len(rows), len(cpus)), dtype=bool)
        for s, r in rows.items():
            table[r, np.searchsorted(cpus, sorted(s))] = True
        member = table[np.asarray(index)].reshape(self.workers, self.threads, len(cpus))
        member.setflags(write=False)
        return member

    @property
    def _shares(self):
        """(W, T, C) float: the fraction of its time each thread is expected on each cpu."""
        member = self._membership
        return member / member.sum(axis=-1, keepdims=True)

    def cpu(self, w, t):
        """The single cpu thread ``t`` of worker ``w`` is bound to, or None if it may move.

        Examples
        --------
        >>> from tuna_lab import Topology
        >>> p = placement("round-robin", 2, 2, Topology.synthetic("core:4 pu:1"))
        >>> p.cpu(1, 0), placement("cfs", 2, 2, p.topology).cpu(1, 0)
        (2, None)
        """
        cpus = self.allowed[w][t]
        return next(iter(cpus)) if len(cpus) == 1 else None

    def as_array(self):
        """The single cpu of each thread, shape (W, T); ``-1`` where a thread may move.

        Examples
        --------
        >>> from tuna_lab import Topology
        >>> placement("round-robin", 2, 3, Topology.synthetic("core:4 pu:1")).as_array().tolist()
        [[0, 1, 2], [3, 0, 1]]
        """
        member = self._membership
        cpu = np.asarray(self.topology.cpus)[member.argmax(axis=-1)]
        return np.where(member.sum(axis=-1) == 1, cpu, -1)

    def expected_loads(self):
        """Expected threads per logical core, aligned with ``topology.cpus``.

        A thread allowed on ``k`` cpus adds ``1/k`` to each of them: exact for
        pinned threads, the scheduler's fair share otherwise. The loads sum to ``W*T``.

        Examples
        --------
        >>> from tuna_lab import Topology
        >>> placement("omp-close", 2, 2, Topology.synthetic("core:4 pu:1")).expected_loads().tolist()
        [2.0, 2.0, 0.0, 0.0]
        """
        return self._shares.sum(axis=(0, 1))

    def to_frame(self):
        """One row per thread: policy, worker, thread, role, allowed, n_allowed, cpu.

        ``allowed`` is the sorted list of cpu ids, or ``"all"`` when the thread
        may run on every cpu of the topology; ``cpu`` is the single cpu, or
        ``<NA>`` when there is more than one.

        Examples
        --------
        >>> from tuna_lab import Topology
        >>> placement("cfs", 1, 2, Topology.synthetic("core:2 pu:1")).to_frame()[["role", "allowed"]]
             role allowed
        0    main     all
        1  openmp     all
        """
        import pandas as pd

        W, T = self.workers, self.threads
        every = frozenset(self.topology.cpus)
        sets = list(itertools.chain.from_iterable(self.allowed))
        return pd.DataFrame({
            "policy": self.policy,
            "worker": np.repeat(np.arange(W), T),
            "thread": np.tile(np.arange(T), W),
            "role": np.tile(np.where(np.arange(T) == 0, "main", "openmp"), W),
            "allowed": ["all" if s == every else sorted(s) for s in sets],
            "n_allowed": [len(s) for s in sets],
            "cpu": pd.array([c if c >= 0 else None for c in self.as_array().ravel().tolist()],
                            dtype="Int64"),
        })

    def describe(self):
        """A short text grid: a header, one line per worker, the expected loads.

        Examples
        --------
        >>> from tuna_lab import Topology
        >>> print(placement("round-robin", 2, 3, Topology.synthetic("core:4 pu:1")).describe())
        round-robin: W=2 x T=3 on synthetic:core:4 pu:1 (C=4, P=4), pinned by tuna_lab
          worker 0: main 0 | 0 1 2
          worker 1: main 3 | 3 0 1
          expected threads per logical core: min 1 max 2 std 0.5
        """
        topo = self.topology
        lines = [f"{self.policy}: W={self.workers} x T={self.threads} on {topo.name} "
                 f"(C={topo.n_logical}, P={topo.n_physical}), pinned by {self.pinned_by}"]
        if self.env:
            lines.append("  env: " + " ".join(f"{k}={v}" for k, v in self.env.items()))
        every = frozenset(topo.cpus)
        cells = [["all" if s == every else format_cpulist(s) for s in row] for row in self.allowed]
        width = max(len(c) for row in cells for c in row)
        wid = len(str(self.workers - 1))
        for w, row in enumerate(cells):
            lines.append(f"  worker {w:>{wid}}: main {row[0]:>{width}} | " + " ".join(f"{c:>{width}}" for c in row))
        loads = self.expected_loads()
        lines.append(f"  expected threads per logical core: min {loads.min():.3g} max {loads.max():.3g} "
                     f"std {loads.std():.3g}")
        return "\n".join(lines)

    def plan(self):
        """The :class:`~tuna_lab.placement.plan.Plan` of this placement: what applying it needs, as JSON.

        Examples
        --------
        >>> from tuna_lab import Topology
        >>> placement("round-robin", 2, 1, Topology.synthetic("core:2 pu:1")).plan().slots
        (((0,),), ((1,),))
        """
        from .plan import Plan

        return Plan.from_placement(self)

    def to_dict(self):
        """A JSON-able description: policy, sizes, env, allowed sets, single cpus, loads.

        ``cpus`` holds ``None`` for threads that may move; ``mapping`` is the
        Tuna mapping's own :meth:`~tuna_lab.model.Mapping.to_dict` or None.

        Examples
        --------
        >>> import json
        >>> from tuna_lab import Topology
        >>> d = placement("round-robin", 1, 2, Topology.synthetic("core:2 pu:1")).to_dict()
        >>> json.loads(json.dumps(d))["cpus"]
        [[0, 1]]
        """
        single = self.as_array()
        return {
            "policy": self.policy,
            "workers": self.workers,
            "threads": self.threads,
            "topology": self.topology.name,
            "logical_cores": self.topology.n_logical,
            "physical_cores": self.topology.n_physical,
            "pinned_by": self.pinned_by.value,
            "env": dict(self.env),
            "allowed": [[sorted(s) for s in row] for row in self.allowed],
            "cpus": [[int(c) if c >= 0 else None for c in row] for row in single.tolist()],
            "expected_loads": dict(zip(map(str, self.topology.cpus), self.expected_loads().tolist())),
            "mapping": None if self.mapping is None else self.mapping.to_dict(),
        }



# -- the registry -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Policy:
    """A placement policy: its name, what it does, who enforces it, and how it places.

    Parameters
    ----------
    name : str
        What users type (``--policy NAME``): letters, digits and ``_ . + -``,
        no commas or spaces.
    description : str
        One line: the placement (the CLI's help and the docs' table show it).
    place : callable
        ``place(workers, threads, topology, **options)``, with ``options``
        ``places``, ``mode``, ``time_limit`` and ``on_infeasible`` (take
        ``**options`` to ignore them). Returns a :class:`Placement`, or the
        ``(W, T)`` nested CPUs of every thread - each a CPU id or a set of
        them - which becomes a placement with this policy's ``pinned_by``
        and no environment.
    needs_solver : bool
        Whether placing loads the Tuna solver (cvxpy, HiGHS): a server process
        then makes its plan in a separate process.
    pinned_by : PinnedBy or str
        Who enforces its placements: ``"tuna_lab"`` (by TID, the default),
        ``"openmp"`` (the OpenMP runtime, from the placement's ``env``) or
        ``"none"``.

    Raises
    ------
    PolicyError
        A malformed name, an empty description or a ``place`` that is not callable.

    Examples
    --------
    >>> from tuna_lab import Topology
    >>> last = Policy("last-cpu", "every thread on the last CPU", lambda W, T, topo, **_: [[topo.cpus[-1]] * T] * W)
    >>> last.placement(2, 2, Topology.synthetic("core:4 pu:1")).as_array().tolist()
    [[3, 3], [3, 3]]
    """

    name: str
    description: str
    place: Callable = field(repr=False, compare=False)
    needs_solver: bool = False
    pinned_by: PinnedBy = PinnedBy.TUNA_LAB

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise PolicyError(f"a policy name is letters, digits and _ . + - (no commas or spaces), got {self.name!r}")
        if not isinstance(self.description, str) or not self.description.strip():
            raise PolicyError(f"policy {self.name!r} needs a one-line description")
        if not callable(self.place):
            raise PolicyError(f"policy {self.name!r}: place must be callable, got {type(self.place).__name__}")
        object.__setattr__(self, "pinned_by", PinnedBy.of(self.pinned_by, PolicyError))
        object.__setattr__(self, "needs_solver", bool(self.needs_solver))

    def placement(self, workers, threads, topology, **options):
        """This policy's :class:`Placement` of ``workers`` x ``threads`` on ``topology``.

        :func:`placement` checks its arguments and calls this; ``options`` go to ``place``.

        Raises
        ------
        PolicyError
            ``place`` returned a placement of another size, enforced by
            another than ``pinned_by``, or something that is no placement.
        """
        placed = self.place(workers, threads, topology, **options)
        if isinstance(placed, Placement):
            if (placed.workers, placed.threads) != (workers, threads) or placed.pinned_by != self.pinned_by:
                raise PolicyError(f"policy {self.name!r} placed {placed.workers}x{placed.threads} pinned by "
                                  f"{placed.pinned_by}, not {workers}x{threads} pinned by {self.pinned_by}")
            return placed if placed.policy == self.name else replace(placed, policy=self.name)
        try:
            allowed = tuple(tuple(frozenset((int(c),)) if isinstance(c, numbers.Integral) else frozenset(c)
                                  for c in row) for row in placed)
        except TypeError:
            raise PolicyError(f"policy {self.name!r} returned {type(placed).__name__}, not a Placement or "
                              "(W, T) nested CPUs") from None
        try:
            return Placement(self.name, workers, threads, topology, allowed, {}, self.pinned_by)
        except ModelError as exc:
            raise PolicyError(f"policy {self.name!r} placed no valid placement: {exc}") from None


_registry = {}
_registry_lock = threading.Lock()


def register(policy):
    """Add ``policy`` to the policies every part of tuna_lab offers (the CLI, the server, ``run``, widgets).

    Parameters
    ----------
    policy : Policy

    Returns
    -------
    Policy
        ``policy``, so that ``register`` can wrap its definition.

    Raises
    ------
    PolicyError
        Not a :class:`Policy`, or a policy of that name is registered already
        (:func:`unregister` it first).

    Examples
    --------
    >>> from tuna_lab import Topology
    >>> p = register(Policy("reverse-rr", "round-robin from the last CPU down",
    ...                     lambda W, T, topo, **_: [[topo.cpus[-1 - (w * T + t) % len(topo.cpus)] for t in range(T)]
    ...                                              for w in range(W)]))
    >>> placement("reverse-rr", 2, 1, Topology.synthetic("core:4 pu:1")).as_array().tolist()
    [[3], [2]]
    >>> register(p)
    Traceback (most recent call last):
    ...
    tuna_lab.errors.PolicyError: a policy named 'reverse-rr' is registered already
    >>> unregister("reverse-rr")
    """
    if not isinstance(policy, Policy):
        raise PolicyError(f"register takes a Policy, got {type(policy).__name__}")
    with _registry_lock:
        if policy.name in _registry:
            raise PolicyError(f"a policy named {policy.name!r} is registered already")
        _registry[policy.name] = policy
    return policy


def unregister(name):
    """Remove the policy ``name`` (a test's, say); :class:`~tuna_lab.errors.PolicyError` if there is none.

    Examples
    --------
    >>> unregister("no-such-policy")
    Traceback (most recent call last):
    ...
    tuna_lab.errors.PolicyError: unknown policy 'no-such-policy'; valid policies: cfs, round-robin, ...
    """
    with _registry_lock:
        found = _registry.pop(name, None) if isinstance(name, str) else None
    if found is None:
        raise _unknown(name)


def registered_policies():
    """Every registered :class:`Policy`, in registration order (the built-in ones first, baselines first).

    Examples
    --------
    >>> [p.name for p in registered_policies() if p.needs_solver]
    ['tuna-scatter', 'tuna-compact']
    """
    with _registry_lock:
        return tuple(_registry.values())


def policy_names():
    """The names of every registered policy, in registration order.

    Examples
    --------
    >>> policy_names()[:3]
    ('cfs', 'round-robin', 'omp-spread')
    """
    return tuple(p.name for p in registered_policies())


def get_policy(name):
    """The registered :class:`Policy` called ``name``.

    Raises
    ------
    PolicyError
        No policy of that name.

    Examples
    --------
    >>> get_policy("tuna-compact").needs_solver, get_policy("omp-close").pinned_by
    (True, <PinnedBy.OPENMP: 'openmp'>)
    """
    with _registry_lock:
        found = _registry.get(name) if isinstance(name, str) else None
    if found is None:
        raise _unknown(name)
    return found


def _unknown(name):
    return PolicyError(f"unknown policy {name!r}; valid policies: {', '.join(policy_names())}")


def placement(policy, workers, threads, topology=None, *, places="cores", mode=None, time_limit=None,
              on_infeasible="relax"):
    """The placement of ``workers`` x ``threads`` under ``policy``.

    Parameters
    ----------
    policy : str or Policy
        A registered policy's name (:func:`policy_names`), or a :class:`Policy`.
    workers, threads : int
        ``W`` server workers, ``T`` OpenMP threads each (thread 0 = main thread).
    topology : Topology, optional
        The machine; ``None`` reads this one (the CPUs this process may use).
    places, mode, time_limit : str, str, float
        ``OMP_PLACES`` of ``omp-*``; the ``tuna-*`` mode (as its name); the solver's seconds (optional).
    on_infeasible : {"relax", "raise"}
        When the families admit no mapping: relax (with a warning), or raise.

    Returns
    -------
    Placement

    Raises
    ------
    PolicyError, ModelError, TopologyError
        An unknown policy; bad workers, threads, places or mode; a bad ``topology``.

    Notes
    -----
    See docs/concepts/policies.md, section "Placement options".

    Examples
    --------
    >>> from tuna_lab import Topology
    >>> topo = Topology.preset("xeon-8272cl")
    >>> placement("omp-spread", 4, 2, topo).env
    {'OMP_PROC_BIND': 'spread', 'OMP_PLACES': 'cores', 'OMP_NUM_THREADS': '2'}
    """
    W, T = check_size(workers, threads, ModelError)
    chosen = policy if isinstance(policy, Policy) else get_policy(policy)
    _check_options(places, mode)
    topology = topology_from(topology)       # a Topology, a preset name or a spec; None: this machine
    placed = chosen.placement(W, T, topology, places=places, mode=mode, time_limit=time_limit,
                              on_infeasible=on_infeasible)
    mapping = placed.mapping
    if mapping is not None and getattr(mapping, "status", None) == "relaxed":
        warnings.warn(f"{chosen.name} {W}x{T}: the families admit no mapping; relaxed mapping used - "
                      + "; ".join(str(r) for r in mapping.relaxed), RelaxedMappingWarning, stacklevel=2)
    return placed


def compare(workers, threads, topology=None, policies=None, *, places="cores", time_limit=None):
    """How evenly each policy loads the machine, and the Tuna objective where it applies.

    Parameters
    ----------
    workers, threads : int
    topology : Topology, optional
        ``None`` reads this machine once for all policies.
    policies : sequence of str
        Which registered policies to compare, default the built-in ones (:data:`POLICIES`).
    places, time_limit
        Passed to :func:`placement`.

    Returns
    -------
    pandas.DataFrame
        Indexed by ``policy``, one row per policy, with columns

        * ``pinned_by``: who enforces the placement;
        * ``max_logical_load``, ``max_physical_load``: largest expected thread
          count on one logical / physical core (see :meth:`Placement.expected_loads`);
        * ``load_std``: standard deviation of the logical-core loads;
        * ``idle_cpus``: logical cores no thread may use;
        * ``stacked_main_cpus``: logical cores expected to host more than one
          main thread (a main thread allowed on ``k`` cpus counts ``1/k``);
        * ``max_main_cpu_load``: largest expected load of a logical core a main
          thread may use (the article's scenario 3: main threads should get the
          cores with ``L``, not ``U``, threads);
        * ``f_main``, ``f_mode``: the Tuna objective terms with the scatter
          sign (``s = +1``), NaN unless every thread is bound to a single cpu.

    Examples
    --------
    >>> from tuna_lab import Topology
    >>> df = compare(4, 4, Topology.synthetic("core:16 pu:1"), ["round-robin", "omp-close"])
    >>> df["max_logical_load"].to_dict(), df["stacked_main_cpus"].to_dict()
    ({'round-robin': 1.0, 'omp-close': 4.0}, {'round-robin': 0, 'omp-close': 1})
    """
    import pandas as pd

    W, T = check_size(workers, threads, ModelError)
    policies = POLICIES if policies is None else (policies,) if isinstance(policies, str) else tuple(policies)
    for policy in policies:
        get_policy(policy)
    _check_options(places, None)
    topology = topology_from(topology)       # a Topology, a preset name or a spec; None: this machine
    distance = topology.distance()
    rows = [_metrics(placement(p, W, T, topology, places=places, time_limit=time_limit), distance)
            for p in policies]
    return pd.DataFrame(rows, index=pd.Index(policies, name="policy"))



# -- the built-in policies ----------------------------------------------------------------------

def _place_cfs(workers, threads, topology, **_):
    every = frozenset(topology.cpus)
    return ((every,) * threads,) * workers


def _place_round_robin(workers, threads, topology, **_):
    # OCC pinning (Algorithm 1): one counter over all threads, worker by
    # worker, main thread first; no notion of load, hence the stacking.
    counter = np.arange(workers * threads).reshape(workers, threads)
    return _singletons(np.asarray(topology.cpus)[counter % topology.n_logical], topology)


def _place_numa(workers, threads, topology, **_):
    nodes = _groups(topology.numa, topology)
    return tuple((nodes[w % len(nodes)],) * threads for w in range(workers))


def _openmp(bind):
    def place(workers, threads, topology, places="cores", **_):
        if places == "cores":
            place_list = _groups(topology.core, topology)
        else:
            place_list = [frozenset((c,)) for c in topology.cpus]
        row = tuple(place_list[i] for i in _gomp_places(threads, len(place_list), bind).tolist())
        env = {"OMP_PROC_BIND": bind, "OMP_PLACES": places, "OMP_NUM_THREADS": str(threads)}
        return Placement(f"omp-{bind}", workers, threads, topology, (row,) * workers, env, PinnedBy.OPENMP)

    return place


def _tuna(wanted):
    def place(workers, threads, topology, mode=None, time_limit=None, on_infeasible="relax", **_):
        if mode is not None and mode != wanted:
            raise ModelError(f"policy 'tuna-{wanted}' solves in {wanted} mode, not {mode!r}")
        from ..model.tuna import solve     # the solver loads only for the policies that need it

        mapping = solve(workers, threads, topology, wanted, time_limit=time_limit, on_infeasible=on_infeasible)
        return Placement(f"tuna-{wanted}", workers, threads, topology, _singletons(mapping.assignment, topology),
                         {}, PinnedBy.TUNA_LAB, mapping)

    return place


for _policy in (
        Policy("cfs", "no binding: the kernel's scheduler (CFS/EEVDF) decides", _place_cfs,
               pinned_by=PinnedBy.NONE),
        Policy("round-robin", "OCC pinning: threads in worker order, `cpus[k % C]`", _place_round_robin),
        Policy("omp-spread", "`OMP_PROC_BIND=spread`, the same in every worker", _openmp("spread"),
               pinned_by=PinnedBy.OPENMP),
        Policy("omp-close", "`OMP_PROC_BIND=close`, the same in every worker", _openmp("close"),
               pinned_by=PinnedBy.OPENMP),
        Policy("numa", "all threads of worker `w` on NUMA node `w % nodes`", _place_numa),
        Policy("tuna-scatter", "the Tuna ILP's mapping, scatter mode", _tuna("scatter"), needs_solver=True),
        Policy("tuna-compact", "the Tuna ILP's mapping, compact mode", _tuna("compact"), needs_solver=True)):
    register(_policy)

#: The built-in policies, baselines first (:func:`policy_names` adds any registered since).
POLICIES = policy_names()

# ---------------------------------------------------------------- helpers
def _check_options(places, mode):
    if places not in _PLACES:
        raise ModelError(f"places must be one of {', '.join(_PLACES)}, got {places!r}")
    if mode is not None and mode not in MODES:
        raise ModelError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


def _singletons(cpus, topology):
    """(W, T) cpu ids -> the nested tuples of one-cpu frozensets, one shared set per cpu."""
    one = {c: frozenset((c,)) for c in topology.cpus}
    return tuple(tuple(one[c] for c in row) for row in np.asarray(cpus).tolist())


def _groups(labels, topology):
    """The cpu sets of each label (physical core, NUMA node), ordered by their lowest cpu."""
    cpus = np.asarray(topology.cpus)
    # Labels are dense by first appearance along the ascending cpus, so label
    # order is lowest-cpu order; sorting keeps that true for any labelling.
    sets = [frozenset(cpus[labels == k].tolist()) for k in np.unique(labels).tolist()]
    return sorted(sets, key=min)


def _gomp_places(T, N, bind):
    """Place index of OpenMP threads ``0..T-1`` over ``N`` places, as libgomp binds them.

    The initial thread sits on place 0 with the whole list as its partition;
    see the module docstring for the rules (libgomp ``gomp_team_start``).

    Examples
    --------
    >>> _gomp_places(3, 8, "spread").tolist(), _gomp_places(5, 2, "close").tolist()
    ([0, 3, 6], [0, 0, 1, 1, 0])
    """
    i = np.arange(T)
    if bind == "spread" and T <= N:
        # T subpartitions, the first N mod T one place longer; bind to their first place.
        s, rest = divmod(N, T)
        return i * s + np.minimum(i, rest)
    # close (and spread with T > N): s threads per place in order, then the
    # T mod N leftovers one per place from place 0 again.
    s = max(T // N, 1)
    return np.where(i < s * N, i // s, i - s * N)


def _metrics(p, distance):
    """One row of :func:`compare` for placement ``p``."""
    topo = p.topology
    shares = p._shares
    loads = shares.sum(axis=(0, 1))
    physical = np.bincount(topo.core, weights=loads, minlength=topo.n_physical)
    main = shares[:, 0].sum(axis=0)
    single = p.as_array()
    f_main = f_mode = np.nan
    if np.all(single >= 0):
        pos = np.searchsorted(topo.cpus, single)
        f_main = float(pair_sums(main_counts(pos, topo.n_logical), distance)[0])
        f_mode = float(pair_sums(worker_counts(pos, topo.n_logical), distance).sum())
    return {
        "pinned_by": p.pinned_by.value,
        "max_logical_load": float(loads.max()),
        "max_physical_load": float(physical.max()),
        "load_std": float(loads.std()),
        "idle_cpus": int(np.sum(loads < _EPS)),
        "stacked_main_cpus": int(np.sum(main > 1 + _EPS)),
        "max_main_cpu_load": float(loads[main > _EPS].max()),
        "f_main": f_main,
        "f_mode": f_mode,
    }
