"""An upper bound on the objective that needs no solver.

Both objective terms are pair sums over an ultrametric, which the counts
encoding writes as ``1/2 [d_top X^2 - sum_l (d_{l+1} - d_l) S_l - d_1 S_0]``
with ``S_l`` the sum of squared per-domain counts at level ``l``. Bounding
every ``S_l`` on its own - smallest possible for a term to be maximised
(spread the count as evenly as the domains' capacities allow), largest
possible for a term to be minimised (fill the biggest domains first) - bounds
the term, and treating the ``W`` workers independently bounds ``f_mode``.
Two pattern bounds tighten it where levels interact with the load and event
families: :func:`sibling_pattern_bound` (single cores and SMT pairs
together) and :func:`domain_pattern_bound` (a coarser level in compact mode),
each a small integer program over "how many cores / domains take each
pattern". :func:`objective_granularity` gives the lattice step of the
objective values. When the constructive mapping reaches a bound (to within
one step) it is optimal (:func:`bound_closes`), proven with no branching at all.

Every function reads the model's rules from a
:class:`~tuna_lab.model.caps.Caps`, so the bound is the bound of the families
that contributed to it; with a family it does not know
(:attr:`Caps.understood` false) the model does not use it.
"""

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

__all__ = ["Certificate", "bound_certificate", "objective_bound", "objective_granularity", "bound_closes",
           "sibling_pattern_bound", "domain_pattern_bound", "domain_shapes", "patterns_infeasible"]


@dataclass(frozen=True)
class Certificate:
    """An upper bound on the objective, with what proves it: enough for a reader to check it.

    Attributes
    ----------
    name : str
        Which bound gave the number: ``"counting"`` (every cache level and
        every worker bounded on its own), or the pattern bounds that
        tightened it, joined by ``+`` (``"sibling-pattern"``,
        ``"domain-pattern"``).
    bound : float
        The bound on the objective the model maximises.
    constant : float
        The objective's constant part (every pair at the top distance).
    levels : tuple of float
        Each cache level's bounded part, finest first; ``bound`` is
        ``constant + sum(levels)``.
    sources : tuple of str
        Per level, the bound that gave its part (``"counting"``,
        ``"sibling-pattern"`` - the single-core and physical-core levels
        together, reported on the first - or ``"domain-pattern"``).
    detail : dict
        The parts' own numbers (``counting_bound``, a fragment program's ...).
    certifies : tuple of str
        The objective terms ``bound`` is on: ``"f_main"`` with (4-5) in the
        model, ``"f_mode"`` with (6-7); empty for a model without objective
        terms, whose bound of 0 proves nothing about a mapping.
    step : float
        The lattice step of the objective values
        (:func:`objective_granularity`; 0 if unknown): a mapping less than one
        step below ``bound`` is optimal.

    Examples
    --------
    >>> from tuna_lab import TunaModel
    >>> TunaModel(4, 4, "xeon-8272cl").certificate()
    Certificate(counting: certifies f_main + f_mode, bound=1500, step=46)
    >>> TunaModel(4, 4, "xeon-8272cl", families=["1"]).certificate()
    Certificate(counting: certifies nothing (the model has no objective term), bound=0)
    """

    name: str
    bound: float
    constant: float = 0.0
    levels: tuple = ()
    sources: tuple = ()
    detail: dict = field(default_factory=dict)
    certifies: tuple = ()
    step: float = 0.0

    def __repr__(self):
        # One line a reader checks the claim by; the parts are in as_dict().
        if not self.certifies:
            return (f"Certificate({self.name}: certifies nothing (the model has no objective term), "
                    f"bound={self.bound:g})")
        missing = [t for t in ("f_main", "f_mode") if t not in self.certifies]
        what = " + ".join(self.certifies) + (f" only ({', '.join(missing)} not in the model)" if missing else "")
        step = f", step={self.step:g}" if self.step else ""
        return f"Certificate({self.name}: certifies {what}, bound={self.bound:.10g}{step})"

    def as_dict(self):
        """The certificate as plain JSON-able values."""
        return {"name": self.name, "bound": self.bound, "constant": self.constant,
                "levels": list(self.levels), "sources": list(self.sources), **self.detail}


def _min_sum_squares(total, caps):
    """min sum x_i^2 over integers 0 <= x_i <= caps_i, sum x_i = total (water filling).

    The minimiser is ``x_i = min(caps_i, lam)`` for the largest integer level
    ``lam`` that does not overshoot, plus one more unit on ``leftover`` of the
    domains that still have room.
    """
    caps = np.asarray(caps, dtype=int)
    total = int(min(total, caps.sum()))
    lo, hi = 0, int(caps.max()) if caps.size else 0
    while lo < hi:                       # largest lam with sum(min(caps, lam)) <= total
        mid = (lo + hi + 1) // 2
        if np.minimum(caps, mid).sum() <= total:
            lo = mid
        else:
            hi = mid - 1
    x = np.minimum(caps, lo)
    leftover = total - int(x.sum())
    room = np.flatnonzero(caps > lo)[:leftover]
    x[room] += 1
    return float(np.sum(x.astype(float) ** 2))


def _max_sum_squares(total, caps):
    """max sum x_i^2 over integers 0 <= x_i <= caps_i, sum x_i = total (biggest first)."""
    caps = np.sort(np.asarray(caps, dtype=int))[::-1]
    left, out = int(total), 0.0
    for cap in caps:
        take = min(cap, left)
        out += take * take
        left -= take
    return out


def _level_best(total, caps, want_small):
    """Best ``sum x_i^2`` of one row at one level: smallest or largest possible."""
    return _min_sum_squares(total, caps) if want_small else _max_sum_squares(total, caps)


def _level_terms(caps, chain):
    """The objective's constant and, per level ``j``, an upper bound of that level's part.

    The objective is ``const - 1/2 sum_j wt_j (S_j(A) + s sum_w S_j(B_w))``
    with ``wt_j = d_{j+1} - d_j`` and ``S_j`` the sum of squared counts over
    the domains of level ``j`` (level 0: single cores). Each level's part is
    bounded on its own and each worker independently.
    """
    inst = caps.instance
    W, T, C = inst.W, inst.T, inst.C
    d = [0.0] + [c for c, _ in chain]
    top = len(d) - 1
    labels = [np.arange(C)] + [np.asarray(lab) for _, lab in chain]
    sizes = [np.bincount(lab) for lab in labels[:-1]]
    use_main = caps.spread_main
    s = caps.sign
    const = 0.5 * d[top] * ((W * W if use_main else 0) + s * W * T * T)
    main_cap = caps.rank_limit
    worker_cap = caps.worker_limit
    domain_caps = None
    levels = []
    for j in range(top):
        wt = d[j + 1] - d[j]
        value = 0.0
        if wt == 0:
            levels.append(value)
            continue
        if use_main:
            room = np.minimum(sizes[j] * main_cap, W)
            value -= 0.5 * wt * _level_best(W, room, want_small=wt > 0)
        if s != 0:
            room = np.minimum(sizes[j] * worker_cap, T)
            small = s * wt > 0
            if not small:
                # load families cap how many threads any domain can hold
                if domain_caps is None:
                    domain_caps = _load_caps(caps, labels)
                room = np.minimum(room, domain_caps[j])
            value -= 0.5 * wt * s * W * _level_best(T, room, want_small=small)
        levels.append(value)
    return const, levels


def _load_caps(caps, labels):
    """Most threads the load families allow in each domain of each level."""
    inst = caps.instance
    C = inst.C
    per_core = np.full(C, float(inst.W * inst.T))
    if caps.load is not None:
        per_core = np.minimum(per_core, caps.load[1])
    out = []
    for lab in labels[:-1]:
        cap = np.bincount(lab, weights=per_core)
        if caps.phys_load is not None:
            n_phys = np.array([len(set(inst.core[lab == g].tolist())) for g in range(lab.max() + 1)])
            cap = np.minimum(cap, n_phys * caps.phys_load[1])
        out.append(np.floor(cap).astype(int))
    return out


def objective_bound(caps, chain, patterns=True, target=None):
    """Upper bound on the objective of any mapping that keeps the rules ``caps``.

    The number of :func:`bound_certificate`; see there.

    Returns
    -------
    float
    """
    return bound_certificate(caps, chain, patterns=patterns, target=target).bound


def bound_certificate(caps, chain, patterns=True, target=None):
    """Upper bound on the objective of any mapping that keeps the rules ``caps``, with its certificate.

    Parameters
    ----------
    caps : Caps
        The model's rules (:meth:`Caps.of <tuna_lab.model.caps.Caps.of>`);
        the objective is ``f_main`` (if ``caps.spread_main``) plus ``f_mode``
        (if ``caps.sign`` is not 0).
    chain : list of (cost, labels)
        :func:`~tuna_lab.model.encodings.ultrametric_chain` of the topology.
    patterns : bool
        Also bound the single-core and physical-core levels jointly by
        :func:`sibling_pattern_bound` (SMT-2 machines), each coarser level by
        :func:`domain_pattern_bound` (compact mode), and keep the smaller bound.
    target : float, optional
        An objective already reached (a known mapping's): when the per-level
        bound is already within :func:`objective_granularity` of it, the
        (slower) pattern bounds are skipped.

    Returns
    -------
    Certificate

    Examples
    --------
    >>> from tuna_lab import Topology, TunaModel
    >>> from tuna_lab.model.encodings import ultrametric_chain
    >>> model = TunaModel(4, 4, Topology.preset("xeon-8272cl"), mode="compact")
    >>> cert = bound_certificate(model.caps, ultrametric_chain(model.instance.topology))
    >>> cert.bound == cert.constant + sum(cert.levels)
    True
    """
    const, levels = _level_terms(caps, chain)
    sources = ["counting"] * len(levels)
    counting = const + sum(levels)
    step = objective_granularity(caps, chain)
    # What the bound is on: the objective terms the rules maximise (Mapping.objective_terms' names).
    certifies = tuple(term for term, on in (("f_main", caps.spread_main), ("f_mode", caps.sign != 0)) if on)

    def certificate(levels, sources):
        bound = const + sum(levels)
        used = [name for name in ("sibling-pattern", "domain-pattern") if name in sources]
        return Certificate("+".join(used) or "counting", float(bound), float(const), tuple(map(float, levels)),
                           tuple(sources), {"counting_bound": float(counting)}, certifies, step)

    if target is not None and bound_closes(counting, target, step):
        return certificate(levels, sources)
    if patterns:
        first = 0
        if len(levels) >= 2:
            joint = sibling_pattern_bound(caps, chain)
            if joint is not None and joint < levels[0] + levels[1]:
                levels[:2] = [joint, 0.0]
                sources[:2] = ["sibling-pattern", "sibling-pattern"]
                first = 2
        for j in range(max(first, 1), len(levels)):
            coarse = domain_pattern_bound(caps, chain, j)
            if coarse is not None and coarse < levels[j]:
                levels[j] = coarse
                sources[j] = "domain-pattern"
    return certificate(levels, sources)


def bound_closes(bound, value, step):
    """Whether ``bound`` proves ``value`` optimal on the lattice of step ``step``.

    True when no objective value of ``value + step Z`` lies above ``value``
    and at or below ``bound`` (``step = 0``: when ``value`` reaches ``bound``).
    """
    tol = 1e-9 * max(1.0, abs(bound))
    if step > 0:
        return bound - value < step - max(tol, 1e-6 * step)
    return value >= bound - tol


def objective_granularity(caps, chain):
    """Step ``g`` such that every feasible objective value lies in ``c + g Z`` (0 if unknown).

    Level ``j`` adds ``-1/2 wt_j (S_j(A) + s sum_w S_j(B_w))``. Since
    ``x^2 = x (mod 2)``, ``S_j(A)`` has the parity of ``W`` and ``sum_w S_j(B_w)``
    that of ``WT`` whatever the mapping, so that level moves the objective in
    steps of ``wt_j``, and the objective in steps of the gcd of the weights
    of the levels that can move (integer costs only). The single-core level
    cannot move when (2) and (3) keep every count 0 or 1. Hence two objective
    values closer than ``g`` are equal - a bound less than ``g`` above a
    mapping's objective proves that mapping optimal.
    """
    use_main = caps.spread_main
    s = caps.sign
    if not use_main and s == 0:
        return 0.0
    d = [0.0] + [float(c) for c, _ in chain]
    main_cap = caps.main_max
    worker_cap = caps.worker_max
    g = 0
    for j in range(len(d) - 1):
        wt = d[j + 1] - d[j]
        if wt == 0:
            continue
        if j == 0 and (not use_main or main_cap <= 1) and (s == 0 or worker_cap <= 1):
            continue
        if not float(wt).is_integer():
            return 0.0
        g = int(np.gcd(g, int(abs(wt))))
    return float(g)


#: Largest number of sibling patterns :func:`sibling_pattern_bound` enumerates.
MAX_PATTERNS = 20000


def sibling_pattern_bound(caps, chain):
    """Upper bound of the single-core and physical-core levels together, from sibling patterns.

    On a machine whose physical cores are pairs of SMT siblings sharing the
    first cache level, with at most one thread of a worker per logical core,
    those two levels' part of the objective is a sum over physical cores of
    a function of the core's *pattern*: its siblings' loads ``l1, l2``, main
    threads ``m1, m2``, and how many workers have a thread on both siblings
    (``q1``/``q2`` pairing a main on sibling 1/2 with the worker's own thread
    on the other sibling, ``po`` pairing two non-main threads). Every family
    is either local to a physical core (loads, rank caps, events) or a count
    over them (the events budgets of (12) and (12+); the totals of threads and
    main threads; and per worker, ``T - 1`` non-main threads make at most
    ``floor((T-1)/2)`` non-main pairs, one fewer slot when its main is
    paired). Forgetting which worker is which, the best count of physical
    cores of each pattern is a small integer program (solved by HiGHS); its
    optimum bounds those two levels of any mapping. It sees what the per-level
    counting bound misses: (11+)-(12+) forbid pairing most main threads with
    a sibling, sibling capacity limits pairs, and workers compete for them.

    Returns ``None`` where it does not apply (no uniform 2-way SMT, siblings
    not the first cache level, several threads of a worker per core, or too
    many patterns), and where no count of patterns fits (then no mapping
    does: :func:`patterns_infeasible`).
    """
    program = _sibling_program(caps, chain)
    return None if program is None else _solve_counts(*program)


def patterns_infeasible(caps, chain):
    """Whether the sibling patterns of :func:`sibling_pattern_bound` prove that no mapping exists.

    Every mapping gives a count of physical cores of each pattern that keeps
    the program's rows (the totals of threads and mains, the events budgets,
    the non-main pairs), so a program with no solution leaves the model none
    either: found in well under a second where HiGHS on the full model looks
    for minutes. ``False`` where the program does not apply or has solutions.

    Examples
    --------
    >>> from tuna_lab import Topology, TunaModel
    >>> from tuna_lab.model.encodings import ultrametric_chain
    >>> topo = Topology.preset("epyc-9654-2s")
    >>> chain = ultrametric_chain(topo)
    >>> patterns_infeasible(TunaModel(192, 2, topo, mode="compact").caps, chain)
    False
    >>> patterns_infeasible(TunaModel(200, 2, topo, mode="compact").caps, chain)   # mains alone, ranks apart
    True
    """
    import highspy

    from ..highs.programs import boxed_max

    program = _sibling_program(caps, chain)
    if program is None:
        return False
    value, A, lb, ub, upper = program
    h = boxed_max(np.zeros(len(value)), A, lb, ub, upper, 5.0, integer=True)
    h.run()
    return h.getModelStatus() == highspy.HighsModelStatus.kInfeasible


def _sibling_program(caps, chain):
    """``(value, A, lb, ub, upper)`` of :func:`sibling_pattern_bound`'s program, or ``None``."""
    inst = caps.instance
    W, T, C, P = inst.W, inst.T, inst.C, inst.P
    if not (P < C and P * 2 == C and np.all(inst.smt == 2)):
        return None
    if len(chain) < 2 or not _same_partition(chain[0][1], inst.core):
        return None
    if caps.worker_max > 1:
        return None
    d1, d2 = chain[0][0], chain[1][0]
    w0, w1 = d1, d2 - d1
    use_main = caps.spread_main
    s = caps.sign
    main_cap = caps.main_max
    nonmain_cap = W if caps.rank_cap is None else caps.rank_cap * (T - 1)
    lo, hi = (0, W) if caps.load is None else caps.load
    hi = min(hi, W)                         # one thread of a worker per logical core
    phys = caps.phys_load is not None
    if phys:
        hi = min(hi, caps.phys_load[1])
    if hi < lo:
        return None
    log_ev = caps.event_budget is not None
    phys_ev = caps.phys_event_budget is not None and phys
    n_l = hi - lo + 1
    if n_l * n_l * (main_cap + 1) ** 2 > MAX_PATTERNS:
        return None
    rows = []      # (value, m, l, log events, phys events, main pairs, other pairs)
    for l1 in range(lo, hi + 1):
        for l2 in range(lo, hi + 1):
            N = l1 + l2
            if phys and not (caps.phys_load[0] <= N <= caps.phys_load[1]):
                continue
            for m1 in range(min(l1, main_cap) + 1):
                if l1 - m1 > nonmain_cap:
                    continue
                for m2 in range(min(l2, main_cap) + 1):
                    if l2 - m2 > nonmain_cap:
                        continue
                    ev_l = int(log_ev and l1 == inst.U and m1 > 0) + int(log_ev and l2 == inst.U and m2 > 0)
                    ev_p = int(phys_ev and N == inst.U_phys and m1 + m2 > 0)
                    base_main = (m1 * m1 + m2 * m2) * w0 + (m1 + m2) ** 2 * w1 if use_main else 0.0
                    for q1 in range(min(m1, l2 - m2) + 1):
                        for q2 in range(min(m2, l1 - m1) + 1):
                            for po in range(min(l1 - m1 - q2, l2 - m2 - q1) + 1):
                                pairs = q1 + q2 + po
                                worker = s * ((l1 + l2) * (w0 + w1) + 2 * w1 * pairs)
                                rows.append((-0.5 * (base_main + worker), m1 + m2, N, ev_l, ev_p,
                                             q1 + q2, po))
                                if len(rows) > MAX_PATTERNS:
                                    return None
    if not rows:
        return None
    R = np.array(rows, dtype=float)
    value, mains, load, ev_l, ev_p, qm, po = R.T
    f1 = max(T - 1, 0) // 2                 # non-main pairs of a worker whose main is unpaired
    f2 = max(T - 2, 0) // 2                 # ... whose main is paired
    A = [np.ones(len(R)), mains, load, po - (f2 - f1) * qm]
    lb = [P, W, W * T, -np.inf]
    ub = [P, W, W * T, W * f1]
    if log_ev:
        A.append(ev_l)
        lb.append(-np.inf)
        ub.append(caps.event_budget)
    if phys_ev:
        A.append(ev_p)
        lb.append(-np.inf)
        ub.append(caps.phys_event_budget)
    return value, A, lb, ub, P


def _same_partition(a, b):
    a, b = np.asarray(a), np.asarray(b)
    pairs = np.unique(np.stack([a, b]), axis=1).shape[1]
    return pairs == len(np.unique(a)) == len(np.unique(b))


def _solve_counts(value, A, lb, ub, upper, time_limit=5.0):
    """max value @ n over integer n in [0, upper] with lb <= A n <= ub; the proven bound, or None."""
    import highspy

    from ..highs.programs import boxed_max

    h = boxed_max(value, A, lb, ub, upper, time_limit, integer=True, options={"mip_rel_gap": 0.0})
    h.run()
    status = h.getModelStatus()
    if status not in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kTimeLimit):
        return None                          # infeasible or failed: no bound from here
    dual = h.getInfo().mip_dual_bound        # (of min -value @ n)
    if not np.isfinite(dual):
        return None
    return float(-dual) + 1e-7 * max(1.0, abs(float(dual)))


def domain_pattern_bound(caps, chain, j):
    """Upper bound of level ``j``'s part of the objective from per-domain patterns (compact mode).

    Level ``j`` adds ``-1/2 wt_j (S_j(A) - sum_w S_j(B_w))`` in compact mode:
    the mains want to be spread over its domains, each worker's threads
    packed into few of them. The per-level bound takes the two apart and lets
    every worker have its domains to itself. Here a domain's part is bounded
    from its *pattern* - threads ``n`` and main threads ``a`` in it, and the
    events of (12)/(12+) it uses: ``n`` is capped by the load families
    (a core hosting a main thread carries ``L``, a physical one ``L+``,
    unless it spends an event), and a worker's share of the domain by its
    cores, minus those that a main thread of another worker holds alone
    (load 1); ``sum_w B_wD^2`` is then at most the biggest-first filling of
    those shares. Choosing how many domains of each shape take each pattern,
    with the totals of threads, mains and events fixed, is a small integer
    program whose optimum bounds the level. Only loosened constraints are
    used, so it is a relaxation; ``None`` where it does not apply.
    """
    inst = caps.instance
    W, T = inst.W, inst.T
    s = caps.sign
    d = [0.0] + [c for c, _ in chain]
    wt = d[j + 1] - d[j]
    if s >= 0 or wt <= 0 or j < 1:
        return None
    use_main = caps.spread_main
    labels = np.asarray(chain[j - 1][1])
    n_dom = int(labels.max()) + 1
    log_ev = caps.event_budget is not None
    # the physical events count only where the domains hold whole physical cores
    whole = _same_partition(np.stack([labels, inst.core]).T @ np.array([inst.C + 1, 1]), inst.core)
    phys_ev = caps.phys_event_budget is not None and caps.phys_load is not None and whole
    K = caps.event_budget if log_ev else None
    Kp = caps.phys_event_budget if phys_ev else None
    classes, shapes = domain_shapes(caps, chain, j)
    rows = []      # pattern rows: (class index, n, a, e_l, e_p, value)
    for ci, a, el, ep, lo, hi, own, other in shapes:
        shares = [own] * min(a, W) + [other] * (W - min(a, W))
        for n in range(max(lo, a), hi + 1):
            h = _max_sum_squares(n, shares)
            if sum(shares) < n:
                continue
            value = -0.5 * wt * ((a * a if use_main else 0) + s * h)
            rows.append((ci, n, a, el, ep, value))
            if len(rows) > MAX_PATTERNS:
                return None
    if not rows:
        return None
    R = np.array(rows, dtype=float)
    ci, n, a, el, ep, value = R.T
    A = [(ci == k).astype(float) for k in range(len(classes))] + [n, a]
    lb = list(classes.values()) + [W * T, W]
    ub = list(classes.values()) + [W * T, W]
    if log_ev:
        A.append(el)
        lb.append(-np.inf)
        ub.append(K)
    if phys_ev:
        A.append(ep)
        lb.append(-np.inf)
        ub.append(Kp)
    return _solve_counts(value, A, lb, ub, n_dom)



def _most_threads(caps, npc, a_max, K, Kp):
    """The most threads ``npc`` physical cores of two SMT siblings can carry, by mains and events.

    ``out[a, e_l, e_p]``: the most threads with ``a`` mains using at most
    ``e_l`` events of (12) and ``e_p`` of (12+) (``-1``: no way to seat the
    mains). Each physical core takes one *type*: its siblings' loads ``l1, l2``
    within the logical load rule ``[L, U]`` and their sum within ``[L+, U+]``,
    and mains ``m1 <= l1``, ``m2 <= l2`` (at most the rank cap each); a
    sibling hosting a main spends ``l - L`` events of (12), a physical core
    hosting one ``l1 + l2 - L+`` of (12+) (0 or 1: (8) and (8+) keep the
    loads within one of each other). A knapsack over the
    cores (all rules are per core, or counts the shape fixes). Without the
    event families the events are free (``K``/``Kp`` ``None``).
    """
    L, U = caps.load
    Lp, Up = caps.phys_load
    m_cap = caps.main_max
    n_l = 1 if K is None else min(K, a_max) + 1
    n_p = 1 if Kp is None else min(Kp, a_max) + 1
    types = set()
    for l1 in range(L, U + 1):
        for l2 in range(L, U + 1):
            if not Lp <= l1 + l2 <= Up:
                continue
            for m1 in range(min(l1, m_cap) + 1):
                for m2 in range(min(l2, m_cap) + 1):
                    # (11)/(11+) as the families define them: (N - L) M, (N+ - L+) M+
                    ev_l = 0 if K is None else (l1 - L) * (m1 > 0) + (l2 - L) * (m2 > 0)
                    ev_p = 0 if Kp is None else (l1 + l2 - Lp) * (m1 + m2 > 0)
                    types.add((l1 + l2, m1 + m2, ev_l, ev_p))
    # of two types that differ only in threads, the one with more
    best = {}
    for threads, m, el, ep in types:
        best[m, el, ep] = max(best.get((m, el, ep), -1), threads)
    out = np.full((a_max + 1, n_l, n_p), -np.inf)
    out[0, 0, 0] = 0.0
    for _ in range(npc):
        nxt = np.full_like(out, -np.inf)
        for (m, el, ep), threads in best.items():
            if m > a_max or el >= n_l or ep >= n_p:
                continue
            moved = np.full_like(out, -np.inf)
            moved[m:, el:, ep:] = out[:a_max + 1 - m, :n_l - el, :n_p - ep] + threads
            nxt = np.maximum(nxt, moved)
        out = nxt
    # at most e_l / e_p events: the best over fewer
    out = np.maximum.accumulate(np.maximum.accumulate(out, axis=1), axis=2)
    return np.where(np.isfinite(out), out, -1)


class DomainShape(NamedTuple):
    """One shape a domain of a class can take (see :func:`domain_shapes`)."""

    #: Index of the domain's class (its size) among the level's classes.
    cls: int
    #: Main threads in the domain (``a``).
    mains: int
    #: Events of (12) spent in the domain (``e_l``).
    events: int
    #: Events of (12+) spent in the domain (``e_p``).
    phys_events: int
    #: Fewest threads the domain can carry.
    lo: int
    #: Most threads the domain can carry.
    hi: int
    #: Most threads a worker can have in it with its main thread there.
    own: int
    #: Most threads a worker can have in it with its main thread elsewhere.
    other: int


def domain_shapes(caps, chain, j):
    """The domains of level ``j`` by class, and every shape a domain of a class can take.

    Returns ``(classes, shapes)``: ``classes`` maps ``(logical cores, physical
    cores)`` to how many domains have that size; each shape is a
    :class:`DomainShape` ``(cls, mains, events, phys_events, lo, hi, own,
    other)``: ``a`` main threads and
    ``e_l``/``e_p`` events of (12)/(12+) in the domain, the fewest and most
    threads it can then carry, and the most threads a worker can have in it
    with its main thread there (``own``) and elsewhere (``other``). See
    :func:`domain_pattern_bound` for the reasoning; only loosened
    constraints are used. :func:`domain_pattern_bound` and
    :func:`~tuna_lab.model.route.fragments.build.fragment_program` both read them.

    Examples
    --------
    >>> from tuna_lab import Topology, TunaModel
    >>> from tuna_lab.model.encodings import ultrametric_chain
    >>> model = TunaModel(64, 6, Topology.preset("epyc-9654-2s"), mode="compact")
    >>> classes, shapes = domain_shapes(model.caps, ultrametric_chain(model.instance.topology), 2)
    >>> classes
    {(16, 8): 24}
    """
    inst = caps.instance
    W, T, C = inst.W, inst.T, inst.C
    labels = np.asarray(chain[j - 1][1])
    n_dom = int(labels.max()) + 1
    size = np.bincount(labels, minlength=n_dom)
    whole = _same_partition(np.stack([labels, inst.core]).T @ np.array([C + 1, 1]), inst.core)
    # the physical load cap bounds a domain only if it holds whole physical cores
    phys = caps.phys_load is not None and whole
    n_phys = np.array([len(np.unique(inst.core[labels == g])) for g in range(n_dom)])
    worker_cap = caps.worker_max
    main_cap = caps.main_max
    has_load = caps.load is not None
    log_ev = caps.event_budget is not None
    phys_ev = caps.phys_event_budget is not None and phys
    K = caps.event_budget if log_ev else None
    Kp = caps.phys_event_budget if phys_ev else None
    classes = {}
    for g in range(n_dom):
        classes[(int(size[g]), int(n_phys[g]))] = classes.get((int(size[g]), int(n_phys[g])), 0) + 1
    shapes = []
    for ci, (sz, npc) in enumerate(classes):
        lo = max(sz * inst.L if has_load else 0, npc * inst.L_phys if phys else 0)
        # where the domain's physical cores are SMT pairs under both load rules: the most threads
        # its cores can carry, core by core (see _most_threads)
        most = _most_threads(caps, npc, min(sz * main_cap, W), K, Kp) \
            if phys and has_load and sz == 2 * npc and np.all(inst.smt == 2) else None
        for a in range(min(sz * main_cap, W) + 1):
            for el in range(min(a, K) + 1 if log_ev else 1):
                for ep in range(min(a, Kp) + 1 if phys_ev else 1):
                    hi = sz * worker_cap * W if not has_load else sz * inst.U
                    if has_load and log_ev and main_cap <= 1:
                        hi -= (a - el) * (inst.U - inst.L)     # main cores at L unless an event
                    if most is not None:
                        carried = int(most[a, min(el, most.shape[1] - 1), min(ep, most.shape[2] - 1)])
                        if carried < 0:
                            continue                # the mains do not fit: no domain takes this shape
                        hi = min(hi, carried)
                    if phys:
                        hp = npc * inst.U_phys
                        if phys_ev:
                            # a physical core hosting mains carries L+ threads unless it spends an
                            # event (then U+): it hosts at most L+ mains, an event core U+ (and
                            # either at most its siblings' share); the ``ep`` event cores take what
                            # they can, the rest need ``k`` cores held at L+
                            room = -(-sz // npc) * main_cap
                            per_low, per_up = min(inst.L_phys, room), min(inst.U_phys, room)
                            rest = max(0, a - ep * per_up)
                            k = -(-rest // per_low) if per_low > 0 else (npc + 1 if rest else 0)
                            if k + ep > npc:
                                continue            # the mains do not fit: no domain takes this shape
                            hp -= k * (inst.U_phys - inst.L_phys)
                        hi = min(hi, hp)
                    hi = min(hi, W * T)
                    # cores a main thread holds alone (at most one thread there)
                    if main_cap > 1 or not has_load:
                        blocked = 0
                    elif log_ev:
                        blocked = (a - el) if inst.L <= 1 else 0
                    else:
                        blocked = a if inst.U <= 1 else 0
                    own = min(T, worker_cap * (sz - max(0, blocked - 1)))
                    # a worker whose main thread is elsewhere has at most T - 1 threads here
                    other = min(T - 1, worker_cap * (sz - blocked))
                    shapes.append(DomainShape(ci, a, el, ep, lo, hi, own, other))
    return classes, shapes
