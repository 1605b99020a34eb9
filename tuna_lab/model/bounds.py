"""An upper bound on the objective that needs no solver.

Both objective terms are pair sums over an ultrametric, which the counts
encoding writes as ``1/2 [d_top X^2 - sum_l (d_{l+1} - d_l) S_l - d_1 S_0]``
with ``S_l`` the sum of squared per-domain counts at level ``l``. Bounding
every ``S_l`` on its own - smallest possible for a term to be maximised
(spread the count as evenly as the domains' capacities allow), largest
possible for a term to be minimised (fill the biggest domains first) - bounds
the term, and treating the ``W`` workers independently bounds ``f_mode``.
When the constructive mapping reaches this bound it is optimal, proven with
no branching at all.
"""

import numpy as np

from .families import PhysicalBalance

__all__ = ["objective_bound"]


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


def _row_bound(chain, sizes_per_level, total, per_core, maximize, domain_caps=None):
    """Best pair sum of one row of counts (a worker's threads, or the main threads)."""
    d = [0.0] + [c for c, _ in chain]
    top = len(d) - 1
    value = 0.5 * d[top] * total * total
    for j in range(top):
        weight = d[j + 1] - d[j]
        if weight == 0:
            continue
        caps = np.minimum(sizes_per_level[j] * per_core, total)
        if domain_caps is not None and domain_caps[j] is not None:
            caps = np.minimum(caps, domain_caps[j])
        s = _min_sum_squares(total, caps) if maximize else _max_sum_squares(total, caps)
        value -= 0.5 * weight * s
    return value


def objective_bound(inst, families, chain):
    """Upper bound on ``f_main + f_mode`` for any mapping satisfying ``families``.

    Parameters
    ----------
    inst : Instance
    families : iterable of Family
    chain : list of (cost, labels)
        :func:`~tuna_lab.model.encodings.ultrametric_chain` of the topology.

    Returns
    -------
    float
    """
    keys = {f.key for f in families}
    C = inst.C
    labels = [np.arange(C)] + [np.asarray(lab) for _, lab in chain]
    sizes = [np.bincount(lab) for lab in labels[:-1]]
    bound = 0.0
    if "4-5" in keys:
        main_cap = inst.cap_rank if "2" in keys else inst.W
        bound += _row_bound(chain, sizes, inst.W, main_cap, maximize=True)
    if "6-7" in keys:
        worker_cap = inst.cap_worker if "3" in keys else inst.T
        if inst.sign > 0:
            bound += inst.W * _row_bound(chain, sizes, inst.T, worker_cap, maximize=True)
        else:
            # load families cap how many threads any domain can hold
            per_core = np.full(C, float(inst.W * inst.T))
            if "8" in keys:
                per_core = np.minimum(per_core, inst.U)
            caps = []
            phys_ok = "8p" in keys and PhysicalBalance().applies(inst)
            for lab in labels[:-1]:
                cap = np.bincount(lab, weights=per_core)
                if phys_ok:
                    n_phys = np.array([len(set(inst.core[lab == g].tolist())) for g in range(lab.max() + 1)])
                    cap = np.minimum(cap, n_phys * inst.U_phys)
                caps.append(np.floor(cap).astype(int))
            bound -= inst.W * _row_bound(chain, sizes, inst.T, worker_cap, maximize=False,
                                         domain_caps=caps)
    return float(bound)
