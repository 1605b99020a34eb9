"""``TunaModel``: the families composed into one cvxpy problem, solved by HiGHS."""

import time
import warnings
from collections import OrderedDict

import cvxpy as cp
import numpy as np

from ..errors import InfeasibleModelError, ModelError, NoSolutionError
from .bounds import _closes, objective_bound, objective_granularity
from .construct import greedy_mapping, local_search
from .encodings import ENCODINGS, make_encoding, ultrametric_chain
from .families import DEFAULT_FAMILIES, FAMILY_TYPES, Family, PhysicalBalance, SingleCore
from .instance import Instance
from .mapping import Mapping

__all__ = ["TunaModel", "solve"]

# HiGHS's presolve does not stop at its time limit; on large models it alone
# takes about this long per nonzero of the constraint matrix (measured on the
# 494k-nonzero epyc-9654-2s 32x16 compact model: 3-9 s on 2 shared CPUs).
_PRESOLVE_S_PER_NONZERO = 1e-5

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

    # -- composition ----------------------------------------------------------------
    def _replace(self, **changes):
        inst = self.instance
        args = dict(workers=inst.W, threads=inst.T, topology=inst.topology, mode=inst.mode,
                    families=self.families, encoding=self.encoding, costs=inst.costs)
        args.update(changes)
        return TunaModel(**args)

    def without(self, *families):
        """A copy of the model without the given families (keys, names or classes)."""
        drop = {type(_resolve_family(f)) for f in families}
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
    def _caps(self):
        keys = {f.key for f in self.families}
        inst = self.instance
        main_max = inst.cap_rank if "2" in keys else inst.W
        worker_max = inst.cap_worker if "3" in keys else inst.T
        return min(main_max, inst.W), min(worker_max, inst.T)

    def _key(self):
        inst = self.instance
        costs = tuple(sorted((inst.costs or {}).items()))
        return (self.encoding, inst.W, inst.T, inst.mode, _topology_key(inst.topology), costs,
                tuple(f.key for f in self.families), tuple(type(f) for f in self.families))

    def build(self):
        """Build (or fetch the cached) cvxpy problem; returns ``(problem, encoding, seconds)``."""
        key = self._key()
        if key in _BUILT:
            _BUILT.move_to_end(key)
            problem, enc = _BUILT[key]
            return problem, enc, 0.0
        t0 = time.perf_counter()
        main_max, worker_max = self._caps()
        enc = make_encoding(self.encoding, self.instance, main_max, worker_max)
        keys = {f.key for f in self.families}
        if "2" in keys:
            enc.rank_cap = self.instance.cap_rank
        if "8" in keys:
            enc.load_cap = self.instance.U
        if "8p" in keys and PhysicalBalance().applies(self.instance):
            enc.phys_load_cap = self.instance.U_phys
        constraints, terms = [], []
        for fam in self.families:
            constraints.extend(fam.constraints(enc))
            if fam.kind == "objective":
                terms.append(fam.term(enc))
            constraints.extend(enc.take_pending())
        if hasattr(enc, "symmetry_constraints"):
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
    def construct(self):
        """The constructive (greedy) mapping as positions ``(W, T)``, or ``None`` if it dead-ends.

        It satisfies every family of the model whenever it is returned.
        """
        inst = self.instance
        if any(type(f) not in FAMILY_TYPES for f in self.families):
            return None             # a user's family may forbid what the greedy rules allow
        labels = [inst.core]
        try:
            labels += [lab for _, lab in ultrametric_chain(inst.topology, inst.costs)]
        except ValueError:
            pass
        best, best_value = None, -np.inf
        for order_by in ("rank", "worker"):
            pos = greedy_mapping(inst, self.families, labels, order_by)
            if pos is None or any(f.violations(pos, inst) for f in self.families):
                continue
            value = sum(f.value(pos, inst) for f in self.families if f.kind == "objective")
            if value > best_value:
                best, best_value = pos, value
        if best is None:
            return None
        # The counts encoding orders workers by their main thread's core
        # position (symmetry breaking); renumbering workers is always allowed.
        return best[np.argsort(best[:, 0], kind="stable")]

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
        not better.
        """
        inst = self.instance
        if start is None or any(type(f) not in FAMILY_TYPES for f in self.families):
            return start
        try:
            better = local_search(start, inst, self.families, time_limit=time_limit)
        except ModelError:
            return start
        if any(f.violations(better, inst) for f in self.families):
            return start

        def value(pos):
            return sum(f.value(pos, inst) for f in self.families if f.kind == "objective")

        if value(better) <= value(start) + 1e-9:
            return start
        return better[np.argsort(better[:, 0], kind="stable")]

    def bound(self, target=None):
        """An upper bound on the objective from per-level counting, or ``None`` (non-nested caches).

        ``target``: an objective already reached; the slower sibling-pattern
        part of the bound is skipped when the counting bound alone proves it
        optimal (see :func:`~tuna_lab.model.bounds.objective_bound`).
        """
        chain = self._chain()
        if chain is None:
            return None
        if target is None and getattr(self, "_full_bound", None) is not None:
            return self._full_bound
        value = objective_bound(self.instance, self.families, chain, target=target)
        if target is None:
            self._full_bound = value
        return value

    def granularity(self):
        """Step of the lattice every objective value lies on (0 if unknown); see
        :func:`~tuna_lab.model.bounds.objective_granularity`."""
        chain = self._chain()
        if chain is None:
            return 0.0
        return objective_granularity(self.instance, {f.key for f in self.families}, chain)

    def _bound_certificate(self, start, construct_s):
        """The constructive mapping, if it already reaches :meth:`bound` (then it is optimal)."""
        # The bound and the numpy checks know the article's families only; a
        # user's own family may add constraints the checks cannot see.
        if any(type(f) not in FAMILY_TYPES for f in self.families):
            return None
        inst = self.instance
        mapping = Mapping(inst, inst.cpus[start], self.families)
        t0 = time.perf_counter()
        bound = self.bound(target=mapping.objective)
        if bound is None or not _closes(bound, mapping.objective, self.granularity()):
            return None
        return Mapping(inst, mapping.assignment, self.families, status="optimal",
                       proven_optimal=True, gap=0.0, bound=max(bound, mapping.objective),
                       build_seconds=0.0, solve_seconds=construct_s + time.perf_counter() - t0,
                       encoding="constructive+bound")

    def solve(self, time_limit=None, gap=None, verbose=False, warm_start=True, prove="auto"):
        """Solve with HiGHS and return a :class:`Mapping`.

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
            ``"solver"`` always lets HiGHS prove optimality.

        Raises
        ------
        InfeasibleModelError
            The families admit no mapping.
        NoSolutionError
            The time limit passed before any mapping was found.
        """
        if time_limit is not None and (isinstance(time_limit, bool) or not (
                isinstance(time_limit, (int, float)) and time_limit > 0)):
            raise ModelError(f"time limit must be a positive number of seconds, got {time_limit!r}")
        if gap is not None and (isinstance(gap, bool) or not (isinstance(gap, (int, float)) and 0 <= gap < 1)):
            raise ModelError(f"gap must be a number in [0, 1), got {gap!r}")
        if prove not in ("auto", "solver", "bound"):
            raise ModelError(f"prove must be auto, solver or bound, got {prove!r}")
        t_begin = time.perf_counter()
        start = None
        # An explicit encoding="pairwise" asks for the literal model: solve it.
        by_bound = prove in ("auto", "bound") and self.encoding != "pairwise"
        if warm_start:
            t1 = time.perf_counter()
            start = self.construct()
            construct_s = time.perf_counter() - t1
            if start is not None and by_bound:
                mapping = self._bound_certificate(start, construct_s)
                if mapping is not None:
                    return mapping
            if start is not None:
                # Not proven yet: polish the greedy mapping by local search
                # (its time comes out of the time limit), then try the bound again.
                budget = 2.0 if time_limit is None else min(2.0, 0.3 * float(time_limit))
                t1 = time.perf_counter()
                start = self.improve(start, time_limit=budget)
                construct_s += time.perf_counter() - t1
                if by_bound:
                    mapping = self._bound_certificate(start, construct_s)
                    if mapping is not None:
                        return mapping
        problem, enc, build_s = self.build()
        t0 = time.perf_counter()
        data, _, inverse = problem.get_problem_data(cp.HIGHS)   # compiled once, cached by cvxpy
        build_s += time.perf_counter() - t0
        # HiGHS minimises -(objective) - offset; keep the offset to turn its
        # dual bound into a bound on our objective.
        offset = float(inverse[-1].get("offset", 0.0)) if inverse else 0.0
        if start is not None:
            _set_start(problem, data, enc.start(start))
        opts = {}
        if time_limit is not None:
            # the limit covers the whole solve: what construction, local search
            # and building took comes out of HiGHS's share (it keeps at least a fifth)
            left = float(time_limit) - (time.perf_counter() - t_begin)
            nnz = data[cp.settings.A].nnz if cp.settings.A in data else 0
            if start is not None and left < _PRESOLVE_S_PER_NONZERO * nnz and by_bound:
                # HiGHS's presolve alone would overrun the time left (it does not
                # stop mid-way): the polished mapping, with its certified gap, is the answer.
                return self._unsolved(start, build_s, construct_s)
            opts["time_limit"] = max(0.2 * float(time_limit), left)
        if gap is not None:
            opts["mip_rel_gap"] = float(gap)
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                # cvxpy warns "may be inaccurate" on a time limit; we report the
                # status and the certified gap ourselves.
                warnings.simplefilter("ignore", UserWarning)
                problem.solve(solver=cp.HIGHS, verbose=verbose, warm_start=start is not None, **opts)
        except cp.error.SolverError as exc:
            raise NoSolutionError(f"HiGHS failed: {exc}") from None
        solve_s = time.perf_counter() - t0
        return self._result(problem, enc, build_s, solve_s, start, offset, prove)

    def _unsolved(self, start, build_s, solve_s):
        """The mapping ``start`` as the answer without HiGHS, with the counting bound's gap."""
        inst = self.instance
        mapping = Mapping(inst, inst.cpus[start], self.families)
        obj = mapping.objective
        bound = self.bound()
        gap, proven = None, False
        if bound is not None:
            bound = max(bound, obj)
            proven = _closes(bound, obj, self.granularity())
            gap = 0.0 if proven else (bound - obj) / max(1.0, abs(obj))
        return Mapping(inst, mapping.assignment, self.families,
                       status="optimal" if proven else "constructed", proven_optimal=proven,
                       gap=gap, bound=bound, build_seconds=build_s, solve_seconds=solve_s,
                       encoding="constructive")

    def _result(self, problem, enc, build_s, solve_s, start=None, offset=0.0, prove="auto"):
        inst = self.instance
        info = problem.solver_stats.extra_stats if problem.solver_stats else None
        status = problem.status
        if status in (cp.INFEASIBLE, "infeasible_or_unbounded"):
            names = ", ".join(f"({f.key}) {f.name}" for f in self.active_families)
            raise InfeasibleModelError(
                f"no mapping of W={inst.W} x T={inst.T} on {inst.C} cores satisfies the families "
                f"{names}", [f.key for f in self.active_families])
        has_solution = status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE, cp.USER_LIMIT) and \
            all(v.value is not None for v in enc.variables()[:1])
        if has_solution and info is not None and getattr(info, "primal_solution_status", 2) != 2:
            has_solution = False
        dual = float(info.mip_dual_bound) if info is not None else float("nan")
        bound = -(dual + offset) if np.isfinite(dual) else None
        if not has_solution:
            if start is None:
                raise NoSolutionError(
                    f"HiGHS found no feasible mapping for W={inst.W} x T={inst.T} ({status}); "
                    "raise the time limit")
            # The solver ran out of time before improving on (or even loading)
            # the constructive mapping: that mapping is the answer, with
            # whatever bound HiGHS proved.
            result_status, positions, proven = "constructed", start, False
        else:
            result_status = "optimal" if status == cp.OPTIMAL else "time_limit"
            positions, proven = enc.extract(), status == cp.OPTIMAL
        assignment = inst.cpus[positions]
        mapping_obj = Mapping(inst, assignment, self.families).objective
        counting = self.bound() if all(type(f) in FAMILY_TYPES for f in self.families) else None
        if counting is not None:
            bound = counting if bound is None else min(bound, counting)
        gap = None
        if bound is not None:
            bound = max(bound, mapping_obj)
            gap = (bound - mapping_obj) / max(1.0, abs(mapping_obj))
        if not proven and prove != "solver" and bound is not None \
                and _closes(bound, mapping_obj, self.granularity()):
            # the bound is less than one lattice step above: nothing better exists
            proven, result_status, gap = True, "optimal", 0.0
        if proven:
            gap = min(gap, 1e-4) if gap is not None else 0.0
        return Mapping(inst, assignment, self.families,
                       status=result_status,
                       proven_optimal=proven, gap=gap, bound=bound,
                       build_seconds=build_s, solve_seconds=solve_s, encoding=enc.name)

    def __repr__(self):
        inst = self.instance
        return (f"TunaModel(W={inst.W}, T={inst.T}, {inst.mode}, topology={inst.topology.name!r}, "
                f"families=[{', '.join(f.key for f in self.families)}], encoding={self.encoding!r})")


def _set_start(problem, data, values):
    """Give HiGHS a starting solution through cvxpy's warm-start cache.

    cvxpy hands HiGHS the previous solve's solution when ``warm_start=True``;
    we put our constructive mapping there instead. Integer columns we know are
    set; the rest are left at 0.5 (binaries) / 0 (continuous), which HiGHS
    treats as a partial solution: it fixes the known integers and completes
    the rest itself.
    """
    import highspy

    from cvxpy.settings import PARAM_PROB

    prog = data[PARAM_PROB]
    n = int(sum(v.size for v in prog.variables))
    x0 = np.zeros(n)
    ints = np.concatenate([np.asarray(data.get("bool_vars_idx", []), dtype=int),
                           np.asarray(data.get("int_vars_idx", []), dtype=int)])
    x0[ints] = 0.5
    for var in prog.variables:
        if var.id in values:
            off = prog.var_id_to_col[var.id]
            x0[off:off + var.size] = np.asarray(values[var.id], dtype=float).ravel(order="F")
    sol = highspy.HighsSolution()
    sol.col_value = x0.tolist()
    sol.value_valid = True
    problem._solver_cache = {"HIGHS": (None, None, {"model_status": "kOptimal", "solution": sol})}


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
        ``time_limit``, ``gap``, ``verbose`` to :meth:`TunaModel.solve`.

    Examples
    --------
    >>> from tuna_lab import solve, Topology
    >>> solve(2, 2, Topology.preset("xeon-8272cl"), mode="compact").proven_optimal
    True
    """
    model_opts = {k: options.pop(k) for k in ("families", "encoding", "costs") if k in options}
    unknown = set(options) - {"time_limit", "gap", "verbose", "warm_start", "prove"}
    if unknown:
        raise ModelError(f"unknown option(s): {', '.join(sorted(unknown))}")
    return TunaModel(workers, threads, topology, mode, **model_opts).solve(**options)
