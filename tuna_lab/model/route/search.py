"""The search for one model's mapping and bound, with the state it keeps while it goes on.

A :class:`~tuna_lab.model.tuna.TunaModel` only declares the problem; a
:class:`Search` searches it. The solve pipeline
(:mod:`~tuna_lab.model.pipeline`) creates one per run and hands it from
step to step: the constructive mapping (:meth:`Search.construct`), then the
bound that may prove it (:meth:`Search.certificate`), then, where the time
limit leaves no room for HiGHS, more of the same bound's search. What one
step finds - the pattern bounds, the fragment programs solved so far
(:class:`FragmentSearch`), the full certificate - the next step reuses, and
it all goes when the run ends. :meth:`TunaModel.construct
<tuna_lab.model.tuna.TunaModel.construct>` and its siblings each run a
search of their own.

Examples
--------
>>> from tuna_lab import Topology, TunaModel
>>> search = Search(TunaModel(4, 4, Topology.preset("xeon-8272cl"), mode="compact"))
>>> start = search.construct()
>>> cert = search.certificate(target=search.model.value(start))
>>> cert.bound >= search.model.value(start)
True
"""

import time

import numpy as np

from .bounds import Certificate, bound_certificate, bound_closes, patterns_infeasible
from .construct import greedy_mapping
from ..encodings import ultrametric_chain
from .fragments import fragment_mapping, fragment_program
from .fragments.program import used_columns

__all__ = ["Search", "FragmentSearch", "chain_of", "ordered"]

#: The share of :meth:`Search.construct`'s time left that a fragment program may take; the rest
#: maps its last plan (the plans it finds on the way are mapped as they come).
_PROGRAM_SHARE = 0.97
#: Least time :meth:`Search.certificate` starts a fragment program with: a program given less
#: rarely finishes, and one that does not is dropped, not tried again.
_MIN_PROGRAM_S = 0.5
#: Seconds each placement program of a fragment plan gets, tried in turn until the mapping reaches
#: the bound (None: all the time left): HiGHS finds a domain's best placement long before it proves it.
_PLACE_LIMITS = (0.25, 1.0, 4.0, None)


def chain_of(instance):
    """The nested cache levels of ``instance``'s topology (:func:`~tuna_lab.model.encodings.ultrametric_chain`),
    or ``None`` where its caches are not nested."""
    try:
        return ultrametric_chain(instance.topology, instance.costs)
    except ValueError:
        return None


def ordered(positions, caps):
    """``positions`` with the workers renumbered by their main thread's core, where every family allows it.

    The counts encoding orders workers so (symmetry breaking); a mapping
    found by other means is brought to the same order.
    """
    return positions[np.argsort(positions[:, 0], kind="stable")] if caps.symmetric else positions


class FragmentSearch:
    """The fragment programs of a model's top cache level (compact mode), each solved at most once.

    The level with its finer levels (where the inner rule applies), then
    alone: the joint bound is tighter, the level's own plan is sometimes the
    better mapping. Lives as long as the :class:`Search` that holds it.

    Attributes
    ----------
    solutions : tuple of FragmentSolution
        The programs solved so far, in order.
    todo : list of (int, bool)
        The programs not tried yet, as ``(level, inner)``.
    """

    def __init__(self, caps, chain):
        self.caps, self.chain = caps, chain
        self.solutions = ()
        self.todo = []
        if chain is not None and caps.understood and caps.sign < 0:
            d = [0.0] + [c for c, _ in chain]
            weighted = [j for j in range(len(d) - 1) if d[j + 1] > d[j]]
            if weighted and weighted[-1] >= 1:
                self.todo = [(weighted[-1], True), (weighted[-1], False)]

    def solve(self, time_limit=5.0, more=None, on_plan=None):
        """The solutions, after solving at most ``more`` of the programs not tried yet (all if ``None``).

        Stops at ``time_limit`` seconds; what did not finish is left out (and
        not tried again). ``on_plan``: see :meth:`FragmentProgram.solve
        <tuna_lab.model.route.fragments.program.FragmentProgram.solve>`.
        """
        deadline = time.perf_counter() + time_limit
        solved = 0
        while self.todo and (more is None or solved < more):
            j, inner = self.todo.pop(0)
            program = fragment_program(self.caps, self.chain, j, inner=inner, deadline=deadline)
            left = deadline - time.perf_counter()
            solution = program.solve(time_limit=left, on_plan=on_plan) if program is not None and left > 0 else None
            solved += 1
            if solution is not None:
                self.solutions += (solution,)
            if time.perf_counter() >= deadline or (program is not None and len(program.levels) == 1):
                self.todo = []              # out of time, or no inner rule: the next is the same
        return self.solutions

    def resume(self, time_limit):
        """Resume the programs left unproven, for ``time_limit`` seconds in all; whether any was."""
        deadline = time.perf_counter() + time_limit
        resumed = []
        for sol in self.solutions:
            left = deadline - time.perf_counter()
            if left > 0 and not sol.proven:
                sol = sol.resume(left)
            resumed.append(sol)
        self.solutions = tuple(resumed)
        return bool(resumed)

    def tighten(self, cert):
        """``cert``, or a tighter :class:`~tuna_lab.model.route.bounds.Certificate` from the programs solved so far."""
        best = cert
        for sol in self.solutions:
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
                                    "fragment_partitions": len(sol.program.partitions)},
                                   cert.certifies, cert.step)
        return best


class _PlanMapper:
    """The mappings of the fragment plans :meth:`Search.construct` meets, each plan mapped once it is complete.

    Keyed by the plan's identity (:func:`~tuna_lab.model.route.fragments.program.used_columns`):
    each plan's best mapping so far and whether its placement programs all
    finished within their limit (more time maps it no better). Every
    mapping found is a candidate too.
    """

    def __init__(self, model, chain, deadline, candidates):
        self.model, self.chain, self.deadline, self.candidates = model, chain, deadline, candidates
        self.mapped = {}

    def map(self, plan, place_limit):
        """``(positions or None, done)``: the plan's best mapping, and whether more time would not improve it."""
        if plan.domains is None:
            return None, True               # no integer plan: nothing to map
        key = (plan.program.levels, frozenset(used_columns(plan.program, plan).items()))
        pos, complete = self.mapped.get(key, (None, False))
        left = self.deadline - time.perf_counter()
        if not complete and left > 0:
            t0 = time.perf_counter()
            new = fragment_mapping(self.model.caps, self.chain, plan, time_limit=left, place_limit=place_limit)
            self.candidates.append(new)
            # done in less than one program's limit: no placement program was cut short
            complete = time.perf_counter() - t0 < min(left, np.inf if place_limit is None else place_limit)
            if new is not None and (pos is None or self.model.value(new) > self.model.value(pos)):
                pos = new
            self.mapped[key] = (pos, complete)
        return pos, complete or left <= 0

    def __call__(self, plan):
        # a plan the search finds on its way, mapped while it goes on: a mapping at hand
        # whatever the search has when its time runs out
        self.map(plan, _PLACE_LIMITS[0])


class Search:
    """The search of one :class:`~tuna_lab.model.tuna.TunaModel`: its mapping by construction, and its bound.

    Keeps what its steps find for the steps after (see the module's text);
    create one per solve, or per question asked of a model.

    Parameters
    ----------
    model : TunaModel
    """

    def __init__(self, model):
        self.model = model
        self.chain = chain_of(model.instance)
        self.fragments = FragmentSearch(model.caps, self.chain)
        self._patterns = None           # bound_certificate with its pattern bounds, once computed
        self._full = None               # the full certificate, once computed without a time limit

    def construct(self, time_limit=5.0):
        """The constructive mapping: see :meth:`TunaModel.construct <tuna_lab.model.tuna.TunaModel.construct>`."""
        model, chain = self.model, self.chain
        if not model.caps.understood:
            return None
        labels = [model.instance.core]
        if chain is not None:
            labels += [lab for _, lab in chain]
        candidates = [greedy_mapping(model.caps, labels, order_by) for order_by in ("rank", "worker")]
        if chain is not None and all(c is None for c in candidates) and patterns_infeasible(model.caps, chain):
            return None                     # no mapping exists: nothing for the fragment programs to map
        # a greedy mapping the counting bound, or the pattern bounds where it falls short, prove needs
        # no fragment program (on hundreds of cores those take seconds and hundreds of MB to find the
        # same; the pattern bounds, small programs over core patterns, well under a second)
        top = self._best_valid(candidates)
        if chain is not None and top is not None and \
                bound_closes(self._bound_certificate(model.value(top)).bound, model.value(top), model.granularity()):
            return ordered(top, model.caps)
        # compact mode: the plans of the fragment programs, dealt and placed
        deadline = time.perf_counter() + time_limit
        mapper = _PlanMapper(model, chain, deadline, candidates)
        # each program's plan as soon as it is solved: a plan that reaches the bound ends the search
        done, reached, counted = 0, False, None
        while not reached:
            # a program that runs to the deadline leaves its plan unmapped: keep some time back for that
            solutions = self.fragments.solve(_PROGRAM_SHARE * max(0.0, deadline - time.perf_counter()), more=1,
                                             on_plan=mapper)
            if len(solutions) <= done:
                break
            sol = solutions[done]
            done = len(solutions)
            if counted is None:             # only where there is a plan: not on construct's every call
                counted, step = bound_certificate(model.caps, chain), model.granularity()
            target = self.fragments.tighten(counted).bound
            # HiGHS finds a domain's best placement long before it proves it: give each placement
            # program a little time first, and more only while the mapping falls short of the bound.
            # A plan forgets which worker is which, and one may put a worker's two fragments in one
            # domain, where no mapping can: then the search's earlier plans, best first
            for plan in (sol,) + sol.alternatives:
                for place_limit in _PLACE_LIMITS:
                    pos, finished = mapper.map(plan, place_limit)
                    if pos is not None and bound_closes(target, model.value(pos), step):
                        reached = True
                    if reached or finished:
                        break
                if reached or pos is not None or deadline <= time.perf_counter():
                    break
        best = self._best_valid(candidates)
        return None if best is None else ordered(best, model.caps)

    def certificate(self, target=None, time_limit=None):
        """The bound's certificate: see :meth:`TunaModel.certificate <tuna_lab.model.tuna.TunaModel.certificate>`.

        With ``time_limit``, the fragment programs this search stopped at
        their time limit go on first, then the next one not tried yet.
        """
        model = self.model
        if self.chain is None or not model.caps.understood:
            return None
        timed = time_limit is not None
        if timed and time_limit > 0:
            deadline = time.perf_counter() + time_limit
            # the stopped searches first (the joint program's: the tighter), then the next program
            # not solved yet, with what is left
            if self.fragments.resume(time_limit):
                self._full = None           # a resumed program may have tightened it
            left = deadline - time.perf_counter()
            if left > _MIN_PROGRAM_S:
                self.fragments.solve(left, more=1)
        if target is None and self._full is not None and not timed:
            return self._full
        step = model.granularity()
        cert = self._bound_certificate(target)
        if cert.sources and not (target is not None and cert.name == "counting"
                                 and cert.bound - target < max(step, 1e-9)):
            if target is not None:
                # the programs solved so far may already close it: then the rest are not needed
                quick = self.fragments.tighten(cert)
                if bound_closes(quick.bound, target, step):
                    return quick
            # with a time limit, only what it allowed: the rest would run past it
            if not timed:
                self.fragments.solve()
            cert = self.fragments.tighten(cert)
        if target is None and not timed:
            self._full = cert
        return cert

    def _bound_certificate(self, target=None):
        """:func:`~tuna_lab.model.route.bounds.bound_certificate` of the model, its pattern bounds computed once.

        With ``target`` closed by the counting bound alone the pattern bounds
        are skipped (and not kept); otherwise the full certificate is kept for
        the next call (construct's check, then the run's certificate).
        """
        if self._patterns is not None:
            return self._patterns
        model = self.model
        cert = bound_certificate(model.caps, self.chain, target=target)
        if target is None or not bound_closes(cert.detail["counting_bound"], target, model.granularity()):
            self._patterns = cert
        return cert

    def _best_valid(self, candidates):
        """The best of ``candidates`` (positions or ``None``) that breaks no family of the model, or ``None``."""
        model = self.model
        inst = model.instance
        valid = [c for c in candidates if c is not None and not any(f.violations(c, inst) for f in model.families)]
        return max(valid, key=model.value) if valid else None
