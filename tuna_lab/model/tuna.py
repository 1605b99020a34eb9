"""``TunaModel``: the families composed into one cvxpy problem, solved by HiGHS.

The model holds the instance, the families and their merged rules
(:class:`~tuna_lab.model.caps.Caps`); it builds the cvxpy problem from the
families' rows, offers the solver-free parts (constructive mapping, local
search, counting bound) and hands :meth:`TunaModel.solve` to the pipeline of
:mod:`~tuna_lab.model.pipeline`.
"""

import time
from collections import OrderedDict

import lazy_loader
import numpy as np

from ..errors import ModelError
from .bounds import Certificate, bound_certificate, bound_closes, objective_granularity, patterns_infeasible
from .caps import Caps
from .construct import greedy_mapping, local_search
from .encodings import ENCODINGS, make_encoding, ultrametric_chain
from .fragments import fragment_mapping, fragment_program
from .families import DEFAULT_FAMILIES, FAMILY_TYPES, Family, SingleCore
from .instance import Instance
from . import pipeline
from .pipeline import SolveOptions

# cvxpy takes most of a second to import; a compact solve that the constructive route
# proves never builds the cvxpy problem, so it is loaded on first use
cp = lazy_loader.load("cvxpy")

__all__ = ["TunaModel", "solve"]

#: The share of :meth:`TunaModel.construct`'s time left that a fragment program may take; the rest
#: maps its last plan (the plans it finds on the way are mapped as they come).
_PROGRAM_SHARE = 0.97
#: Least time :meth:`TunaModel.certificate` starts a fragment program with.
_MIN_PROGRAM_S = 0.5
#: Seconds each placement program of a fragment plan gets, tried in turn until the mapping reaches
#: the bound (None: all the time left).
_PLACE_LIMITS = (0.25, 1.0, 4.0, None)

# Built problems are kept so that toggling a mode or a family back and forth
# re-solves without re-building or re-compiling (cvxpy caches the compiled
# problem on the Problem object). Small: a notebook explores a few at a time.
_BUILT = OrderedDict()
_BUILT_MAX = 32


def _resolve_family(spec):
    """A family from an instance, a class, its key ("11-12"), its class name or an equation number."""
    if isinstance(spec, Family):
        return spec
    if isinstance(spec, type) and issubclass(spec, Family):
        return spec()
    if isinstance(spec, (str, int)):
        s = str(spec).strip().strip("()")
        for ftype in FAMILY_TYPES:
            if s in (ftype.key, ftype.__name__) or s in ftype.equations:
                return ftype()
    raise ModelError(f"unknown constraint family {spec!r}; known: "
                     + ", ".join(f"{f.key} ({f.__name__})" for f in FAMILY_TYPES))


def _topology_key(topo):
    caches = tuple((k, np.asarray(v).tobytes()) for k, v in sorted(topo.caches.items()))
    # NUMA nodes matter once a remote cost prices them.
    return (topo.name, tuple(topo.cpus), np.asarray(topo.core).tobytes(), np.asarray(topo.numa).tobytes(), caches,
            tuple(sorted(topo.costs.items())))


class TunaModel:
    """The Tuna 0-1 ILP for ``workers`` x ``threads`` on ``topology``.

    Parameters
    ----------
    workers, threads : int
        Gunicorn workers and OpenMP threads per worker.
    topology : Topology, optional
        The machine; ``None`` reads this one (:meth:`Topology.from_sysfs`).
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
    families : tuple of Family
        In canonical build order.
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
        if topology is None:
            from ..machine.topology import Topology

            topology = Topology.from_sysfs()
        self.instance = Instance(workers, threads, topology, mode, costs)
        fams = DEFAULT_FAMILIES if families is None else tuple(_resolve_family(f) for f in families)
        # Keep the canonical build order whatever order the user gave.
        order = {ftype: i for i, ftype in enumerate(FAMILY_TYPES)}
        self.families = tuple(sorted(dict.fromkeys(fams), key=lambda f: order.get(type(f), 99)))
        if not any(isinstance(f, SingleCore) for f in self.families):
            # Without (1) a solution need not place every thread exactly once,
            # so there is no mapping to return.
            raise ModelError("family (1) defines what a mapping is (every thread on exactly one core); "
                             "it cannot be removed")
        if encoding not in ENCODINGS:
            raise ModelError(f"encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
        self.encoding = encoding
        self._check_requirements()
        self.caps = Caps.of(self.instance, self.families)
        self._full_bound = None
        self._pattern_bound = None          # bound_certificate with its pattern bounds, once computed
        self._fragments = None
        self._fragment_todo = None          # fragment programs not solved yet; None: not listed yet

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
        here = {f.key: f for f in self.families}
        drop = {type(here[f]) if isinstance(f, str) and f in here else type(_resolve_family(f))
                for f in families}
        return self._replace(families=[f for f in self.families if type(f) not in drop])

    def with_(self, *families):
        """A copy of the model with the given families added."""
        return self._replace(families=list(self.families) + [_resolve_family(f) for f in families])

    def with_mode(self, mode):
        """A copy of the model in the other mode (same families and topology)."""
        return self._replace(mode=mode)

    def _check_requirements(self):
        keys = {f.key for f in self.families}
        for fam in self.families:
            missing = [k for k in fam.requires if k not in keys]
            if missing and fam.active(self.instance):
                raise ModelError(f"family ({fam.key}) needs ({', '.join(missing)}) in the same model")

    @property
    def active_families(self):
        return tuple(f for f in self.families if f.active(self.instance))

    # -- building ---------------------------------------------------------------------
    def _key(self):
        inst = self.instance
        costs = tuple(sorted((inst.costs or {}).items()))
        return (self.encoding, inst.W, inst.T, inst.mode, _topology_key(inst.topology), costs,
                tuple(f.key for f in self.families), tuple(type(f) for f in self.families))

    def build(self, cached_only=False):
        """Build (or fetch the cached) cvxpy problem; returns ``(problem, encoding, seconds)``.

        ``cached_only``: fetch only - ``None`` if the problem is not built
        yet (building takes a second on hundreds of cores, which a solve
        that the constructive route proves does not need).
        """
        key = self._key()
        if key in _BUILT:
            _BUILT.move_to_end(key)
            problem, enc = _BUILT[key]
            return problem, enc, 0.0
        if cached_only:
            return None
        t0 = time.perf_counter()
        enc = make_encoding(self.encoding, self.instance, self.caps)
        # Every family returns all its rows (auxiliary definitions included);
        # an objective family's term reuses the variables its rows define.
        constraints = [row for fam in self.families for row in fam.constraints(enc)]
        terms = [fam.term(enc) for fam in self.families if fam.kind == "objective"]
        constraints.extend(enc.symmetry_constraints())
        objective = cp.Maximize(sum(terms) if terms else cp.Constant(0.0))
        problem = cp.Problem(objective, constraints)
        _BUILT[key] = (problem, enc)
        if len(_BUILT) > _BUILT_MAX:
            _BUILT.popitem(last=False)
        return problem, enc, time.perf_counter() - t0

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
        (:mod:`~tuna_lab.model.fragments`) are candidates too; ``time_limit``
        caps the seconds their programs and placements take together.

        ``None`` when the greedy placement dead-ends, or when a family of the
        model contributes no caps (:attr:`Caps.understood
        <tuna_lab.model.caps.Caps.understood>`): the greedy rules could not
        honour it. It satisfies every family of the model whenever it is
        returned.
        """
        if not self.caps.understood:
            return None
        inst = self.instance
        labels = [inst.core]
        chain = self._chain()
        if chain is not None:
            labels += [lab for _, lab in chain]
        candidates = [greedy_mapping(self.caps, labels, order_by) for order_by in ("rank", "worker")]
        if chain is not None and all(c is None for c in candidates) and patterns_infeasible(self.caps, chain):
            return None                     # no mapping exists: nothing for the fragment programs to map
        # a greedy mapping the counting bound, or the pattern bounds where it falls short, prove needs
        # no fragment program (on hundreds of cores those take seconds and hundreds of MB to find the
        # same; the pattern bounds, small programs over core patterns, well under a second)
        top = self._best_valid(candidates)
        if chain is not None and top is not None and \
                bound_closes(self._bound_certificate(chain, self.value(top)).bound, self.value(top),
                             self.granularity()):
            return self._ordered(top)
        # compact mode: the plans of the fragment programs, dealt and placed
        deadline = time.perf_counter() + time_limit
        # each program's plan as soon as it is solved: a plan that reaches the bound ends the search
        done, reached, counted = 0, False, None

        # each plan's best mapping so far and whether its placement programs all finished within their
        # limit (more time maps it no better), by the plan's counts (the plan itself kept alive with them)
        mapped = {}

        def mapping(plan, place_limit):
            key = id(plan.domains)
            _, pos, complete = mapped.get(key, (plan, None, False))
            left = deadline - time.perf_counter()
            if not complete and left > 0:
                t0 = time.perf_counter()
                new = fragment_mapping(self.caps, chain, plan, time_limit=left, place_limit=place_limit)
                candidates.append(new)
                # done in less than one program's limit: no placement program was cut short
                complete = time.perf_counter() - t0 < min(left, np.inf if place_limit is None else place_limit)
                if new is not None and (pos is None or self.value(new) > self.value(pos)):
                    pos = new
                mapped[key] = (plan, pos, complete)
            return pos, complete or left <= 0

        def on_plan(plan):
            # a plan the search finds on its way, mapped while it goes on: a mapping at hand
            # whatever the search has when its time runs out
            mapping(plan, _PLACE_LIMITS[0])

        while not reached:
            # a program that runs to the deadline leaves its plan unmapped: keep some time back for that
            solutions = self._fragment_solutions(_PROGRAM_SHARE * max(0.0, deadline - time.perf_counter()), more=1,
                                                 on_plan=on_plan)
            if len(solutions) <= done:
                break
            sol = solutions[done]
            done = len(solutions)
            if counted is None:             # only where there is a plan: not on construct's every call
                counted, step = bound_certificate(self.caps, chain), self.granularity()
            target = self._with_fragments(counted, compute=False).bound
            # HiGHS finds a domain's best placement long before it proves it: give each placement
            # program a little time first, and more only while the mapping falls short of the bound.
            # A plan forgets which worker is which, and one may put a worker's two fragments in one
            # domain, where no mapping can: then the search's earlier plans, best first
            for plan in (sol,) + sol.alternatives:
                for place_limit in _PLACE_LIMITS:
                    pos, finished = mapping(plan, place_limit)
                    if pos is not None and bound_closes(target, self.value(pos), step):
                        reached = True
                    if reached or finished:
                        break
                if reached or pos is not None or deadline <= time.perf_counter():
                    break
        best = self._best_valid(candidates)
        return None if best is None else self._ordered(best)

    def _best_valid(self, candidates):
        """The best of ``candidates`` (positions or ``None``) that breaks no family of the model, or ``None``."""
        inst = self.instance
        valid = [c for c in candidates if c is not None and not any(f.violations(c, inst) for f in self.families)]
        return max(valid, key=self.value) if valid else None

    def _ordered(self, pos):
        # The counts encoding orders workers by their main thread's core
        # position (symmetry breaking), which renumbering workers reaches
        # whenever every family allows it.
        return pos[np.argsort(pos[:, 0], kind="stable")] if self.caps.symmetric else pos

    def value(self, positions):
        """The objective this model maximises at ``positions`` (W, T): its objective families' terms.

        Equal to :attr:`Mapping.objective` (``f_main + f_mode``) with both
        terms in the model; what :meth:`bound` bounds.
        """
        inst = self.instance
        return float(sum(f.value(positions, inst) for f in self.families if f.kind == "objective"))

    def _chain(self):
        inst = self.instance
        try:
            return ultrametric_chain(inst.topology, inst.costs)
        except ValueError:
            return None

    def improve(self, start, time_limit=2.0):
        """A mapping at least as good as ``start`` (positions ``(W, T)``), by local search.

        See :func:`~tuna_lab.model.construct.local_search`; the result is
        checked against every family and ``start`` is kept if it fails or is
        not better (or if a family contributes no caps).
        """
        inst = self.instance
        if start is None or not self.caps.understood:
            return start
        try:
            better = local_search(start, self.caps, time_limit=time_limit)
        except ModelError:
            return start
        if any(f.violations(better, inst) for f in self.families):
            return start
        if self.value(better) <= self.value(start) + 1e-9:
            return start
        return self._ordered(better)

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
        """The :class:`~tuna_lab.model.bounds.Certificate` of :meth:`bound`: the bound and what proves it.

        ``None`` where :meth:`bound` is ``None``. See
        :func:`~tuna_lab.model.bounds.bound_certificate`. ``time_limit``:
        seconds the fragment programs whose search stopped at its time
        limit may go on for (:meth:`FragmentSolution.resume
        <tuna_lab.model.fragments.FragmentSolution.resume>`), until the
        bound reaches ``target``; none by default.
        """
        chain = self._chain()
        if chain is None or not self.caps.understood:
            return None
        timed = time_limit is not None
        if timed and time_limit > 0:
            deadline = time.perf_counter() + time_limit
            # the stopped searches first (the joint program's: the tighter), then the next program
            # not solved yet, with what is left
            self._resume_fragments(time_limit)
            left = deadline - time.perf_counter()
            if left > _MIN_PROGRAM_S:        # (a program given less is dropped, not tried again)
                self._fragment_solutions(left, more=1)
        if target is None and self._full_bound is not None and not timed:
            return self._full_bound
        cert = self._bound_certificate(chain, target)
        if cert.sources and not (target is not None and cert.name == "counting"
                                 and cert.bound - target < max(self.granularity(), 1e-9)):
            if target is not None:
                # the programs solved so far may already close it: then the rest are not needed
                quick = self._with_fragments(cert, compute=False)
                if bound_closes(quick.bound, target, self.granularity()):
                    return quick
            # with a time limit, only what it allowed: the rest would run past it
            cert = self._with_fragments(cert, compute=not timed)
        if target is None and not timed:
            self._full_bound = cert
        return cert

    def _bound_certificate(self, chain, target=None):
        """:func:`~tuna_lab.model.bounds.bound_certificate` of the model, its pattern bounds computed once.

        With ``target`` closed by the counting bound alone the pattern bounds
        are skipped (and not kept); otherwise the full certificate is kept for
        the next call (construct's check, then the run's certificate).
        """
        if self._pattern_bound is not None:
            return self._pattern_bound
        cert = bound_certificate(self.caps, chain, target=target)
        if target is None or not bound_closes(cert.detail["counting_bound"], target, self.granularity()):
            self._pattern_bound = cert
        return cert

    def _resume_fragments(self, time_limit):
        """Resume the fragment programs left unproven, for ``time_limit`` seconds in all."""
        deadline = time.perf_counter() + time_limit
        resumed = []
        for sol in self._fragments or ():
            left = deadline - time.perf_counter()
            if left > 0 and not sol.proven:
                sol = sol.resume(left)
            resumed.append(sol)
        if resumed:
            self._fragments = tuple(resumed)
            self._full_bound = None          # a resumed program may have tightened it

    def _fragment_solutions(self, time_limit=5.0, more=None, on_plan=None):
        """The solved fragment programs of the top cache level (compact mode), each computed once.

        The level with its finer levels (where the inner rule applies), then
        alone: the joint bound is tighter, the level's own plan is sometimes
        the better mapping. Solves at most ``more`` of those not solved yet
        (all if ``None``), stopping at ``time_limit`` seconds; what did not
        finish is left out (and not tried again). ``on_plan``: see
        :meth:`FragmentProgram.solve <tuna_lab.model.fragments.FragmentProgram.solve>`.
        """
        if self._fragment_todo is None:
            todo = []
            chain = self._chain()
            if chain is not None and self.caps.understood and self.caps.sign < 0:
                d = [0.0] + [c for c, _ in chain]
                weighted = [j for j in range(len(d) - 1) if d[j + 1] > d[j]]
                if weighted and weighted[-1] >= 1:
                    todo = [(weighted[-1], True), (weighted[-1], False)]
            self._fragment_todo, self._fragments = todo, ()
        deadline = time.perf_counter() + time_limit
        solved = 0
        while self._fragment_todo and (more is None or solved < more):
            j, inner = self._fragment_todo.pop(0)
            program = fragment_program(self.caps, self._chain(), j, inner=inner, deadline=deadline)
            left = deadline - time.perf_counter()
            solution = program.solve(time_limit=left, on_plan=on_plan) if program is not None and left > 0 else None
            solved += 1
            if solution is not None:
                self._fragments += (solution,)
            if time.perf_counter() >= deadline or (program is not None and len(program.levels) == 1):
                self._fragment_todo = []            # out of time, or no inner rule: the next is the same
        return self._fragments

    def _with_fragments(self, cert, compute=True):
        """``cert``, or a tighter :class:`Certificate` from the fragment programs (those solved so far
        unless ``compute``)."""
        best = cert
        for sol in self._fragment_solutions() if compute else (self._fragments or ()):
            covered = sol.program.levels
            levels = list(cert.levels)
            sources = list(cert.sources)
            for i in covered:
                levels[i] = 0.0
                sources[i] = "fragment-pattern"
            levels[covered[0]] = sol.bound
            bound = cert.constant + sum(levels)
            if bound < best.bound:
                used = [n for n in ("sibling-pattern", "domain-pattern", "fragment-pattern") if n in sources]
                best = Certificate("+".join(used), float(bound), cert.constant, tuple(levels), tuple(sources),
                                   {**cert.detail, "fragment_levels": list(covered),
                                    "fragment_bound": float(sol.bound),
                                    "fragment_columns": len(sol.program.columns),
                                    "fragment_partitions": len(sol.program.partitions)})
        return best

    def granularity(self):
        """Step of the lattice every objective value lies on (0 if unknown); see
        :func:`~tuna_lab.model.bounds.objective_granularity`."""
        chain = self._chain()
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
        return pipeline.run_or_relax(self, SolveOptions(time_limit, gap, verbose, warm_start, prove), on_infeasible)

    def __repr__(self):
        inst = self.instance
        return (f"TunaModel(W={inst.W}, T={inst.T}, {inst.mode}, topology={inst.topology.name!r}, "
                f"families=[{', '.join(f.key for f in self.families)}], encoding={self.encoding!r})")


def solve(workers, threads, topology=None, mode="scatter", **options):
    """Solve the Tuna mapping for ``workers`` x ``threads``.

    Parameters
    ----------
    workers, threads : int
    topology : Topology, optional
        ``None`` means this machine (the CPUs this process may use).
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
