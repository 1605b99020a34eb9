"""When the families admit no mapping: explain the conflict, then relax the family that yields.

:func:`run_or_relax` is what :meth:`TunaModel.solve
<tuna_lab.model.tuna.TunaModel.solve>` calls: the mapping
:func:`~tuna_lab.model.pipeline.run` finds, or, where the families admit
none, a minimal conflicting subset from :mod:`tuna_lab.model.explain` and
the nearest mapping - the yielding family's slack least, then the objective
greatest (docs/model.md, "explain, then relax"). It sits above both the
pipeline and the explanation, which asks the pipeline for its verdicts.

Examples
--------
>>> from tuna_lab import Topology, TunaModel
>>> from tuna_lab.model.pipeline import SolveOptions
>>> m = run_or_relax(TunaModel(24, 2, Topology.preset("xeon-8272cl")), SolveOptions(time_limit=30))
>>> m.status, [(r.family, r.amount) for r in m.relaxed]
('relaxed', [('11-12', 8.0)])
"""

import time
from dataclasses import dataclass

import lazy_loader
import numpy as np

from ..errors import InfeasibleModelError, ModelError, NoSolutionError
from .route.bounds import bound_closes
from .explain import counting_conflict, explain
from .mapping import Mapping
from .pipeline import ON_INFEASIBLE, RunRecord, SolveOptions, infeasible_error, json_plain, run
from .highs.solve import Clock, compile_problem, run_highs, unpack

# cvxpy is loaded on first use, as in the pipeline: most relaxations are proven without it.
cp = lazy_loader.load("cvxpy")

__all__ = ["run_or_relax"]


def run_or_relax(model, options, on_infeasible="relax"):
    """The mapping of ``model``: :func:`run`'s, or where its families admit none, the nearest one.

    Where the families admit no mapping, :func:`~tuna_lab.model.explain.explain`
    finds a minimal conflicting subset (the counting argument first, so that
    a conflict it knows costs no solver run). ``on_infeasible="raise"``
    raises its :class:`~tuna_lab.errors.InfeasibleModelError`. ``"relax"``
    lets the subset's yielding family go elastic and repeats until the rest
    admits a mapping; then :func:`_relaxed` finds the mapping that exceeds
    the yielding families least, and among those the one with the greatest
    objective.
    """
    if on_infeasible not in ON_INFEASIBLE:
        raise ModelError(f"on_infeasible must be relax or raise, got {on_infeasible!r}")
    clock = Clock(options.time_limit)
    conflicts, current = [], model
    while True:
        conflict = counting_conflict(current.caps)
        if conflict is None:
            try:
                base = run(current, _left(options, clock))
                break
            except InfeasibleModelError as exc:
                try:
                    left = None if options.time_limit is None else max(0.1, clock.left())
                    conflict = explain(current, time_limit=left)
                except NoSolutionError:
                    raise exc from None
                if conflict is None:
                    raise
        conflicts.append(conflict)
        if on_infeasible == "raise" or conflict.yielding is None:
            raise conflict.error(model.instance) from None
        current = current.without(conflict.yielding)
    if not conflicts:
        return base
    return _relaxed(model, current, base, conflicts, options, clock)


def _left(options, clock):
    """``options`` with the time left on ``clock``."""
    limit = None if options.time_limit is None else max(0.05, clock.left())
    return SolveOptions(limit, options.gap, options.verbose, options.warm_start, options.prove)


def _violation(families, positions, inst):
    return float(sum(f.residual(positions, inst).sum() for f in families))


def _relaxed(model, rest, base, conflicts, options, clock):
    """The lexicographic optimum: least slack on the yielding families, then the greatest objective.

    ``rest``: ``model`` without the yielding families, whose optimum (or best
    mapping, with its bound) is ``base``. Where the counting argument
    proves that every mapping of ``rest`` exceeds the yielding families by
    the same least amount (:attr:`Conflict.min_violation
    <tuna_lab.model.explain.Conflict.min_violation>`), ``base`` is the
    answer with its own proof: the stage-two problem has no mapping ``rest``
    lacks and ``base`` is at the least slack. Otherwise (or with
    ``prove="solver"``) HiGHS solves both stages on the yielding families'
    elastic rows (:meth:`Family.elastic <tuna_lab.model.families.Family.elastic>`).
    """
    inst = model.instance
    keys = {c.yielding for c in conflicts}
    yielded = [f for f in model.families if f.key in keys]
    v_base = _violation(yielded, base.positions, inst)
    known = [c.min_violation for c in conflicts]
    lower = float(sum(known)) if all(k is not None for k in known) else None
    if options.prove != "solver" and lower is not None and v_base <= lower + 1e-9:
        stage1 = {"violation": v_base, "lower_bound": lower, "proof": "counting", "proven": True}
        stage2 = _Stage2(base.proven_optimal, base.bound, base.gap, base.encoding, base.build_seconds,
                         base.solve_seconds)
        return _relaxed_mapping(model, base.positions, yielded, conflicts, stage1, stage2,
                                dict(base.certificate), base.notes)
    return _relaxed_by_highs(model, rest, base, yielded, conflicts, lower, v_base, options, clock)


def _relaxed_by_highs(model, rest, base, yielded, conflicts, lower, v_base, options, clock):
    """Both stages of :func:`_relaxed` by HiGHS, each given half of the time left (the second all of it)."""
    from .encodings import make_encoding

    inst = model.instance
    t0 = time.perf_counter()
    enc = make_encoding(model.encoding, inst, rest.caps)
    rows = [row for fam in rest.families for row in fam.constraints(enc)]
    slacks = []
    for fam in yielded:
        more, slack = fam.elastic(enc)
        rows += more
        slacks.append(slack)
    rows += enc.symmetry_constraints()
    total = sum(slacks)
    terms = [fam.term(enc) for fam in rest.families if fam.kind == "objective"]
    record = RunRecord()
    highs = {} if options.gap is None else {"mip_rel_gap": float(options.gap)}
    # stage 1: the least total slack
    first = cp.Problem(cp.Maximize(-total), rows)
    compiled = compile_problem(first)
    build = time.perf_counter() - t0
    half = None if options.time_limit is None else Clock(max(0.1, 0.5 * clock.left()))
    out = run_highs(compiled, enc, base.positions, options.verbose, dict(highs), half or Clock(None), record)
    seconds = record.highs_seconds
    best, s_star, lb = base.positions, v_base, 0.0 if lower is None else lower
    if out is not None and "error" not in out:
        if out["model_status"] == "kInfeasible":
            raise infeasible_error(model, "(even with the yielding families' rows elastic)")
        if out["info"]["primal_solution_status"] == 2 and out["col_value"] is not None:
            unpack(first, compiled, out)
            pos = enc.extract()
            v = _violation(yielded, pos, inst)
            if v < s_star - 1e-9 and not any(f.violations(pos, inst) for f in rest.families):
                best, s_star = pos, v
        if out["model_status"] == "kOptimal":
            lb = max(lb, s_star)
        elif np.isfinite(out["info"]["mip_dual_bound"]):
            lb = max(lb, float(np.ceil(out["info"]["mip_dual_bound"] + compiled["offset"] - 1e-6)))
    stage1 = {"violation": s_star, "lower_bound": lb, "proof": "highs",
              "proven": bool(lb >= s_star - 1e-9)}
    value = rest.value(best)
    bound = base.bound if v_base <= s_star + 1e-9 else None
    proven2, by = base.proven_optimal and v_base <= s_star + 1e-9, "base"
    if not proven2:
        # stage 2: the greatest objective at that slack
        second = cp.Problem(cp.Maximize(sum(terms) if terms else cp.Constant(0.0)), rows + [total <= s_star])
        t1 = time.perf_counter()
        compiled = compile_problem(second)
        build += time.perf_counter() - t1
        record = RunRecord()
        out = run_highs(compiled, enc, best, options.verbose, dict(highs), clock, record)
        seconds += record.highs_seconds
        if out is not None and "error" not in out:
            info = out["info"]
            if info["primal_solution_status"] == 2 and out["col_value"] is not None:
                unpack(second, compiled, out)
                pos = enc.extract()
                if (_violation(yielded, pos, inst) <= s_star + 1e-9 and rest.value(pos) > value + 1e-9
                        and not any(f.violations(pos, inst) for f in rest.families)):
                    best, value = pos, rest.value(pos)
            dual = -(float(info["mip_dual_bound"]) + compiled["offset"]) if np.isfinite(
                info["mip_dual_bound"]) else None
            if base.bound is not None:
                dual = base.bound if dual is None else min(dual, base.bound)
            bound = dual
            proven2, by = out["model_status"] == "kOptimal", "highs"
    if bound is not None:
        bound = max(bound, value)
        if not proven2 and bound_closes(bound, value, rest.granularity()):
            proven2 = True
    gap = None if bound is None else (0.0 if proven2 else (bound - value) / max(1.0, abs(value)))
    certificate = {"name": "highs" if by == "highs" else base.certificate.get("name", "none"),
                   "proven": bool(proven2), "objective": float(value),
                   "bound": None if bound is None else float(bound), "gap": gap,
                   "step": float(rest.granularity()), "dual_bound": None, "combinatorial": None}
    stage2 = _Stage2(proven2, bound, gap, f"relaxed:{enc.name}", base.build_seconds + build,
                     base.solve_seconds + seconds)
    return _relaxed_mapping(model, best, yielded, conflicts, stage1, stage2, certificate, base.notes)


@dataclass(frozen=True)
class _Stage2:
    """What the second stage (the greatest objective at the least slack) ends with, and what the run cost.

    Its fields travel together from :func:`_relaxed` or :func:`_relaxed_by_highs`
    into the :class:`Mapping`: whether stage two is proven, its bound and gap,
    the route that found it, and the build and solve seconds of both stages.
    """

    proven: bool
    bound: float | None
    gap: float | None
    route: str
    build_seconds: float
    solve_seconds: float


def _relaxed_mapping(model, positions, yielded, conflicts, stage1, stage2, certificate, notes):
    """The relaxed :class:`Mapping` of ``positions``: what yielded and by how much, and both stages' proofs."""
    from .mapping import Relaxed

    inst = model.instance
    relaxed = []
    for fam in yielded:
        amount = float(fam.residual(positions, inst).sum())
        if amount > 0:
            why = "; ".join(v.message for v in fam.violations(positions, inst))
            relaxed.append(Relaxed(fam.key, amount, why))
    proven2 = stage2.proven
    proven = bool(stage1["proven"] and proven2)
    lines = [f"the families {c.describe()}" for c in conflicts]
    # what yielded and by how much is Mapping.relaxed (its own lines): the note says only why that is the answer
    least = f"proven by {stage1['proof']}" if stage1["proven"] else "not proven"
    lines.append("relaxing " + ", ".join(f"({r.family})" for r in relaxed) + f" that much is the least possible "
                 f"({least}), and the objective under it the greatest ({'proven' if proven2 else 'not proven'})")
    certificate["relaxation"] = {"families": [f.key for f in yielded], "conflicts": [c.as_dict() for c in conflicts],
                                 "stage1": json_plain(stage1), "stage2_proven": bool(proven2)}
    return Mapping(inst, inst.cpus[positions], model.families, status="relaxed", proven_optimal=proven,
                   gap=stage2.gap, bound=stage2.bound, build_seconds=stage2.build_seconds,
                   solve_seconds=stage2.solve_seconds, encoding=stage2.route,
                   notes=tuple(notes) + tuple(lines), certificate=certificate, relaxed=tuple(relaxed))
