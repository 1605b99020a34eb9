"""``TunaModel``: the families composed into one problem - declared here, searched elsewhere.

The model holds the instance, the families, their merged rules
(:class:`~tuna_lab.model.caps.Caps`), the mode and the encoding, and
nothing else: it is immutable. Its cvxpy problem is built by
:mod:`~tuna_lab.model.problem` (and cached there by the model's
declaration); the solver-free parts (constructive mapping, bound) run a
:class:`~tuna_lab.model.route.search.Search`; :meth:`TunaModel.solve` hands the
model to the pipeline of :mod:`~tuna_lab.model.pipeline`, which owns the
search of that solve.
"""

import numpy as np

from ..errors import ModelError
from .assignment import checked_assignment
from .route.bounds import objective_granularity
from .caps import Caps
from .route.construct import local_search
from .encodings import ENCODINGS
from .families import DEFAULT_FAMILIES, FAMILY_TYPES, SingleCore, resolve_family
from .instance import Instance
from . import relax
from .pipeline import SolveOptions
from .problem import BUILD_CACHE
from .route.search import Search, chain_of, ordered

__all__ = ["TunaModel", "solve"]


def _check_requirements(instance, families):
    keys = {f.key for f in families}
    for fam in families:
        missing = [k for k in fam.requires if k not in keys]
        if missing and fam.active(instance):
            raise ModelError(f"family ({fam.key}) needs ({', '.join(missing)}) in the same model")


class TunaModel:
    """The Tuna 0-1 ILP for ``workers`` x ``threads`` on ``topology``: what is asked, not how it is found.

    A model is immutable: :meth:`with_`, :meth:`without` and
    :meth:`with_mode` return new models, and it holds no search state -
    each solve runs its own :class:`~tuna_lab.model.route.search.Search`, and the
    built cvxpy problems live in :data:`~tuna_lab.model.problem.BUILD_CACHE`.

    Parameters
    ----------
    workers, threads : int
        Gunicorn workers and OpenMP threads per worker.
    topology : Topology or str, optional
        The machine; ``None`` reads this one (:meth:`Topology.from_sysfs`), a
        string is read by :func:`~tuna_lab.machine.topology_from` (a preset
        name such as ``"xeon-8272cl"``, a synthetic spec, hwloc XML).
    mode : {"scatter", "compact"}
        Whether the threads of a worker are spread apart or packed together.
    families : iterable, optional
        The constraint families and objective terms; default: all of them.
    encoding : {"auto", "counts", "pairwise"}
        ``pairwise`` is the article's literal encoding; ``counts`` the exact
        compact one (see :mod:`tuna_lab.model.encodings`); ``auto`` picks
        ``counts`` whenever the caches are nested.
    costs : dict, optional
        Cache-distance costs overriding the topology's.

    Attributes
    ----------
    instance : Instance
        ``W``, ``T``, the topology, the mode and the costs.
    families : tuple of Family
        In canonical build order.
    encoding : str
        As given (``"auto"`` is resolved when the problem is built).
    caps : Caps
        What the families ask, as numbers: the one answer to "which rules
        apply" that the constructive route, the bound and the encodings read.

    Examples
    --------
    >>> from tuna_lab import Topology, TunaModel
    >>> model = TunaModel(4, 4, Topology.preset("xeon-8272cl"))
    >>> [f.key for f in model.without("11-12").families][-2:]
    ['9-10', '11p-12p']
    >>> model.solve().proven_optimal
    True
    """

    def __init__(self, workers, threads, topology=None, mode="scatter", families=None,
                 encoding="auto", costs=None):
        from ..machine.spec import topology_from

        # A Topology as it is; a preset name, a synthetic spec or hwloc XML read as ModeExplorer and
        # recommend read them; anything else refused with one line.
        topology = topology_from(topology)
        instance = Instance(workers, threads, topology, mode, costs)
        fams = DEFAULT_FAMILIES if families is None else tuple(resolve_family(f) for f in families)
        # Keep the canonical build order whatever order the user gave.
        order = {ftype: i for i, ftype in enumerate(FAMILY_TYPES)}
        fams = tuple(sorted(dict.fromkeys(fams), key=lambda f: order.get(type(f), 99)))
        if not any(isinstance(f, SingleCore) for f in fams):
            # Without (1) a solution need not place every thread exactly once,
            # so there is no mapping to return.
            raise ModelError("family (1) defines what a mapping is (every thread on exactly one core); "
                             "it cannot be removed")
        if encoding not in ENCODINGS:
            raise ModelError(f"encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
        _check_requirements(instance, fams)
        # the one place attributes are set: every method returns a new model instead
        object.__setattr__(self, "instance", instance)
        object.__setattr__(self, "families", fams)
        object.__setattr__(self, "encoding", encoding)
        object.__setattr__(self, "caps", Caps.of(instance, fams))

    def __setattr__(self, name, value):
        raise AttributeError(f"a TunaModel is immutable: {name!r} cannot be set; with_(), without() and "
                             "with_mode() return new models")

    def __delattr__(self, name):
        raise AttributeError(f"a TunaModel is immutable: {name!r} cannot be deleted")

    # -- composition ----------------------------------------------------------------
    def _replace(self, **changes):
        inst = self.instance
        args = dict(workers=inst.W, threads=inst.T, topology=inst.topology, mode=inst.mode,
                    families=self.families, encoding=self.encoding, costs=inst.costs)
        args.update(changes)
        return TunaModel(**args)

    def without(self, *families):
        """A copy of the model without the given families (keys, names or classes).

        A key may also name a family of one's own that the model holds.
        """
        drop = {type(resolve_family(f, self.families)) for f in families}
        return self._replace(families=[f for f in self.families if type(f) not in drop])

    def with_(self, *families):
        """A copy of the model with the given families added."""
        return self._replace(families=list(self.families) + [resolve_family(f, self.families) for f in families])

    def with_mode(self, mode):
        """A copy of the model in the other mode (same families and topology)."""
        return self._replace(mode=mode)

    @property
    def active_families(self):
        return tuple(f for f in self.families if f.active(self.instance))

    # -- building ---------------------------------------------------------------------
    def build(self, cached_only=False):
        """Build (or fetch the cached) cvxpy problem; returns ``(problem, encoding, seconds)``.

        Problems are kept in :data:`~tuna_lab.model.problem.BUILD_CACHE`, by
        the model's declaration. ``cached_only``: fetch only - ``None`` if
        the problem is not built yet (building takes a second on hundreds
        of cores, which a solve that the constructive route proves does not
        need).
        """
        if cached_only:
            cached = BUILD_CACHE.get(self)
            return None if cached is None else cached + (0.0,)
        return BUILD_CACHE.build(self)

    def size(self):
        """Model size: variables (integer among them), constraint rows."""
        problem, enc, _ = self.build()
        n_vars = sum(v.size for v in problem.variables())
        n_int = sum(v.size for v in problem.variables()
                    if v.attributes.get("boolean") or v.attributes.get("integer"))
        n_rows = sum(c.size for c in problem.constraints)
        return {"encoding": enc.name, "variables": int(n_vars), "integer_variables": int(n_int),
                "constraints": int(n_rows)}

    # -- solving -------------------------------------------------------------------------
    def construct(self, time_limit=5.0):
        """The constructive (greedy) mapping as positions ``(W, T)``, or ``None``.

        In compact mode the plans of the fragment programs
        (:mod:`~tuna_lab.model.route.fragments`) are candidates too; ``time_limit``
        caps the seconds their programs and placements take together.

        ``None`` when the greedy placement dead-ends, or when a family of the
        model contributes no caps (:attr:`Caps.understood
        <tuna_lab.model.caps.Caps.understood>`): the greedy rules could not
        honour it. It satisfies every family of the model whenever it is
        returned. Each call searches afresh (:class:`~tuna_lab.model.route.search.Search`).
        """
        return Search(self).construct(time_limit)

    def value(self, positions):
        """The objective this model maximises at ``positions`` (W, T): its objective families' terms.

        Equal to :attr:`Mapping.objective` (``f_main + f_mode``) with both
        terms in the model; what :meth:`bound` bounds.
        """
        inst = self.instance
        return float(sum(f.value(positions, inst) for f in self.families if f.kind == "objective"))

    def improve(self, start, time_limit=2.0):
        """A mapping at least as good as ``start`` (positions ``(W, T)``), by local search.

        See :func:`~tuna_lab.model.route.construct.local_search`; the result is
        checked against every family and ``start`` itself is returned if it
        fails or is not better (or if a family contributes no caps).

        Raises
        ------
        ModelError
            ``start`` is not a ``(W, T)`` array of this topology's core
            positions (:func:`~tuna_lab.model.assignment.checked_assignment`),
            or leaves a thread unassigned (``-1``): the search moves threads of
            a complete mapping.
        """
        inst = self.instance
        if start is None:
            return start
        # One ModelError line for a start that is not a mapping (numpy would raise its own, or index out of range).
        positions = checked_assignment(start, inst)
        if (positions < 0).any():
            w, t = (int(i) for i in np.argwhere(positions < 0)[0])
            raise ModelError(f"improve starts from a complete mapping: thread {t} of worker {w} is unassigned (-1)")
        if not self.caps.understood:
            return start
        try:
            better = local_search(positions, self.caps, time_limit=time_limit)
        except ModelError:
            return start
        if any(f.violations(better, inst) for f in self.families):
            return start
        if self.value(better) <= self.value(positions) + 1e-9:
            return start
        return ordered(better, self.caps)

    def bound(self, target=None):
        """An upper bound on the objective from per-level counting, or ``None``.

        ``None`` with non-nested caches, and when a family contributes no
        caps (:attr:`Caps.understood <tuna_lab.model.caps.Caps.understood>`):
        the bound knows only the rules it is given, and a family of one's
        own may even change the objective.

        ``target``: an objective already reached; the slower pattern parts
        of the bound are skipped when the counting bound alone proves it
        optimal. The number of :meth:`certificate`.
        """
        cert = self.certificate(target=target)
        return None if cert is None else cert.bound

    def certificate(self, target=None, time_limit=None):
        """The :class:`~tuna_lab.model.route.bounds.Certificate` of :meth:`bound`: the bound and what proves it.

        ``None`` where :meth:`bound` is ``None``. See
        :func:`~tuna_lab.model.route.bounds.bound_certificate`. ``time_limit``:
        seconds the fragment programs may take (the first one, in compact
        mode), where the bound is to come in time rather than in full; none
        by default. Each call searches afresh; within one solve the pipeline's
        :meth:`Search.certificate <tuna_lab.model.route.search.Search.certificate>`
        resumes the programs an earlier step stopped.
        """
        return Search(self).certificate(target=target, time_limit=time_limit)

    def granularity(self):
        """Step of the lattice every objective value lies on (0 if unknown); see
        :func:`~tuna_lab.model.route.bounds.objective_granularity`."""
        chain = chain_of(self.instance)
        if chain is None or not self.caps.understood:
            return 0.0
        return objective_granularity(self.caps, chain)

    def explain(self, time_limit=None):
        """Why the families admit no mapping: a minimal conflicting subset, or ``None`` if they admit one.

        See :func:`~tuna_lab.model.explain.explain`: the counting argument
        where it applies (no solver), else a deletion filter over the
        solve pipeline's verdicts.

        Returns
        -------
        Conflict or None

        Examples
        --------
        >>> from tuna_lab import Topology, TunaModel
        >>> print(TunaModel(10, 2, Topology.synthetic("pack:1 l3:2 l2:2 core:2 pu:2")).explain().describe())
        (2) and (11-12) (with (8), (9-10), which they read) admit no mapping together: (8) puts U=2 threads on r=4 of the 16 cores and L=1 on the others; (2) lets a core hold at most 1 thread of each rank, so a core without a main thread holds at most 1x(T-1) = 1 < U threads: all 4 cores at U carry a main thread, but (11-12) allows at most max(0, W-C+r) = max(0, 10-16+4) = 0
        >>> TunaModel(4, 4, Topology.preset("xeon-8272cl")).explain() is None
        True
        """
        from .explain import explain

        return explain(self, time_limit=time_limit)

    def solve(self, time_limit=None, gap=None, verbose=False, warm_start=True, prove="auto",
              on_infeasible="relax"):
        """Solve and return a :class:`Mapping`: by construction and bound where they prove it, else by HiGHS.

        The stages are those of :mod:`~tuna_lab.model.pipeline`.

        Parameters
        ----------
        time_limit : float, optional
            Seconds the solve may spend (construction, local search, building
            and HiGHS; HiGHS keeps at least a fifth of it); on expiry the best
            mapping found is returned with ``proven_optimal=False`` and its gap.
        gap : float, optional
            Relative MIP gap at which HiGHS stops (default: HiGHS's own, 1e-4).
        verbose : bool
            Show HiGHS's log.
        warm_start : bool
            Hand HiGHS the constructive mapping (:meth:`construct`) as its first incumbent.
        prove : {"auto", "solver", "bound"}
            ``"auto"``/``"bound"`` skip HiGHS when the constructive mapping already
            reaches the counting bound (:meth:`bound`), which proves it optimal;
            ``"solver"`` always lets HiGHS prove optimality (both stages of a
            relaxation too).
        on_infeasible : {"relax", "raise"}
            When the families admit no mapping: ``"relax"`` returns the
            nearest one (``status == "relaxed"``; the yielding family of a
            minimal conflicting subset (:meth:`explain`) exceeded least,
            then the objective maximised at that least excess; see
            :attr:`Mapping.relaxed`), ``"raise"`` raises.

        Raises
        ------
        ModelError
            A bad option.
        InfeasibleModelError
            The families admit no mapping, and ``on_infeasible="raise"`` or
            no family of the conflict may yield; its ``families`` are a
            minimal conflicting subset, its ``reason`` says why.
        NoSolutionError
            The time limit passed before any mapping was found.
        """
        return relax.run_or_relax(self, SolveOptions(time_limit, gap, verbose, warm_start, prove), on_infeasible)

    def __repr__(self):
        inst = self.instance
        return (f"TunaModel(W={inst.W}, T={inst.T}, {inst.mode}, topology={inst.topology.name!r}, "
                f"families=[{', '.join(f.key for f in self.families)}], encoding={self.encoding!r})")


def solve(workers, threads, topology=None, mode="scatter", **options):
    """Solve the Tuna mapping for ``workers`` x ``threads``.

    Parameters
    ----------
    workers, threads : int
    topology : Topology or str, optional
        ``None`` means this machine (the CPUs this process may use); a string
        is a preset name, a synthetic spec or hwloc XML (:func:`~tuna_lab.machine.topology_from`).
    mode : {"scatter", "compact"}
    **options
        ``families``, ``encoding``, ``costs`` go to :class:`TunaModel`;
        ``time_limit``, ``gap``, ``verbose``, ``on_infeasible`` to :meth:`TunaModel.solve`.

    Examples
    --------
    >>> from tuna_lab import solve, Topology
    >>> solve(2, 2, Topology.preset("xeon-8272cl"), mode="compact").proven_optimal
    True
    """
    model_opts = {k: options.pop(k) for k in ("families", "encoding", "costs") if k in options}
    unknown = set(options) - {"time_limit", "gap", "verbose", "warm_start", "prove", "on_infeasible"}
    if unknown:
        raise ModelError(f"unknown option(s): {', '.join(sorted(unknown))}")
    return TunaModel(workers, threads, topology, mode, **model_opts).solve(**options)
