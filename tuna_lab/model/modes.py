"""What the scatter/compact toggle changes, in words: the logic behind the mode explorer's lines and the demo's.

It lives with the model, not the widgets: the demo (``tuna-lab demo``) says in these words why its
scatter and compact mappings are one, and the command line may not import the widgets.

Plain Python over two mappings of one instance, one per mode. Scatter
maximises and compact minimises the same sum - the cache distance between
each two threads of one worker (``|f_mode|``, called the *spread* here) - so
the two modes differ exactly when the constraints leave the solver mappings
of different spread. Where they do not, :func:`why_same` says why in one
line and names a change that makes them differ, checked by solving it.

Examples
--------
>>> from tuna_lab import solve
>>> s, c = (solve(4, 4, "xeon-8272cl", m) for m in ("scatter", "compact"))
>>> print(why_same(s, c).split(", and")[0])
with the physical-core balance (8+) on, W x T = 16 <= P = 16 gives every thread a physical core of its own
>>> s, c = (solve(4, 4, "epyc-7313p", m) for m in ("scatter", "compact"))
>>> why_same(s, c) is None, difference(s, c).split(";")[0]
(True, 'scatter and compact differ: 12 of 16 threads sit on other cores')
"""

import numpy as np

from .families import DEFAULT_FAMILIES, pair_sums, worker_counts
from .tuna import solve

__all__ = ["PHYSICAL_KEYS", "families", "differ", "spread", "worker_terms", "own_siblings", "domains_spanned",
           "why_same", "difference", "physical_effect", "EXAMPLE"]

#: The physical-core analogues of (8) and (11-12): what :meth:`ModeExplorer.toggle_physical` puts in or out.
PHYSICAL_KEYS = ("8p", "11p-12p")

#: Where the explorer opens: four CCDs with an L3 each, so scatter spreads a worker over all four and
#: compact packs it into one (found by solving the presets at small sizes; the article's xeon-8272cl
#: has one L3 for all cores, so at 4 x 4 both modes give the same mapping).
EXAMPLE = {"topology": "epyc-7313p", "workers": 4, "threads": 4}


def families(physical=True):
    """The default families, without the physical-core analogues (:data:`PHYSICAL_KEYS`) if not ``physical``."""
    return DEFAULT_FAMILIES if physical else tuple(f for f in DEFAULT_FAMILIES if f.key not in PHYSICAL_KEYS)


def worker_terms(mapping):
    """Each worker's term of ``f_mode`` (signed as the mode signs it), shape (W,); they sum to ``f_mode``."""
    inst = mapping.instance
    return inst.sign * pair_sums(worker_counts(mapping.positions, inst.C), inst.distance)


def spread(mapping):
    """The cache distance between each two threads of one worker, summed over workers: ``|f_mode|``."""
    return float(abs(mapping.f_mode))


def own_siblings(mapping):
    """Threads that share a physical core with another thread of their own worker."""
    core = np.asarray(mapping.topology.core)[mapping.positions]
    return int(sum(len(row) - len(set(row.tolist())) for row in core))


def domains_spanned(mapping):
    """``(level, mean)``: the outermost cache level and how many of its domains a worker's threads span on average."""
    caches = mapping.topology.caches
    level = next((lv for lv in ("L4", "L3", "L2") if lv in caches), None)
    if level is None:
        return None, 0.0
    labels = np.asarray(caches[level])[mapping.positions]
    return level, float(np.mean([len(set(row.tolist())) for row in labels]))


def differ(scatter, compact):
    """Whether the two modes' mappings spread a worker's threads differently (``|f_mode|`` differs)."""
    return not np.isclose(spread(scatter), spread(compact))


def _pair(inst, physical, time_limit, changes=None):
    """Both modes' mappings of ``inst`` with ``changes`` (workers, threads, topology, physical)."""
    changes = dict(changes or {})
    physical = changes.pop("physical", physical)
    args = {"workers": inst.W, "threads": inst.T, "topology": inst.topology, **changes}
    return tuple(solve(args["workers"], args["threads"], args["topology"], mode, families=families(physical),
                       time_limit=time_limit) for mode in ("scatter", "compact"))


def _fewer(n, least):
    """``n // 2, n // 4, ...`` down to ``least``: a few sizes below ``n``, so that a search stays cheap."""
    k = n // 2
    while k >= least:
        yield k
        k //= 2


def _candidates(inst, physical):
    """Changes that can make the modes differ, as ``(words, changes)``, the smallest first.

    One change at a time first, then fewer threads or workers with the
    physical-core balance off too. Fewer threads (or workers) come from
    halving, a handful of sizes: where the workers fill the machine
    (``1 x 32`` on 32 cores) every placement spreads them alike, and only
    a smaller ``W x T`` leaves the modes a choice.

    Examples
    --------
    >>> from tuna_lab.model.instance import Instance
    >>> from tuna_lab import Topology
    >>> [words for words, _ in _candidates(Instance(1, 8, Topology.preset("epyc-7313p")), True)][:4]
    ['the physical-core balance off (toggle_physical())', 'W x T above P = 16 (e.g. 1 x 17)', '1 x 4 (fewer threads)', '1 x 2 (fewer threads)']
    """
    W, T, P = inst.W, inst.T, inst.P
    base, said = {}, ""
    if T == 1:
        # f_mode has no pair to weigh with one thread per worker: every other change needs a second thread.
        base, said = {"threads": 2}, "2 threads per worker and "
        yield "2 threads per worker", dict(base)
        T = 2
    if physical:
        yield f"{said}the physical-core balance off (toggle_physical())", {**base, "physical": False}
    if W * T <= P:
        more = -(-(P + 1) // W)             # the fewest threads with W x T above P
        if more * W <= inst.C:
            yield f"W x T above P = {P} (e.g. {W} x {more})", {"threads": more}
    # Fewer threads, then fewer workers (threads first: a worker's own threads are what f_mode weighs).
    smaller = [(f"{W} x {t} (fewer threads)", {"threads": t}) for t in _fewer(T, 2)]
    smaller += [(f"{w} x {T} (fewer workers)", {**base, "workers": w}) for w in _fewer(W, 1)]
    yield from smaller
    if physical:
        # Every thread on a physical core of its own may leave them alike (one L3 for all):
        # sharing physical cores again is the second half of the change.
        for words, changes in smaller:
            yield f"{words} with the physical-core balance off", {**changes, "physical": False}
    if inst.topology.name != EXAMPLE["topology"]:
        yield f"{said}a machine with several L3s ({EXAMPLE['topology']})", {**base, "topology": EXAMPLE["topology"]}


def _remedy(inst, physical, time_limit):
    """The first candidate change that makes the modes differ, checked by solving it, in words."""
    for words, changes in _candidates(inst, physical):
        try:
            scatter, compact = _pair(inst, physical, time_limit, changes)
        except (ValueError, ArithmeticError):
            continue                        # a change the families refuse (ModelError is a ValueError)
        if differ(scatter, compact):
            return f"{words} makes them differ (spread {spread(scatter):g} vs {spread(compact):g})"
    return ("no small change tried (physical balance off, more or fewer threads, fewer workers, several L3s) "
            "makes them differ")


def why_same(scatter, compact, physical=True, time_limit=5.0):
    """Why both modes give mappings of the same spread, in one line with the change that separates them.

    ``None`` when they differ. ``physical``: whether the physical-core
    analogues were in the model. The change named is checked by solving it
    (a few small solves, ``time_limit`` seconds each at most).
    """
    if differ(scatter, compact):
        return None
    inst = scatter.instance
    W, T, P, name = inst.W, inst.T, inst.P, inst.topology.name
    fix = _remedy(inst, physical, time_limit)
    if T == 1:
        return (f"each worker runs 1 thread, and f_mode sums the distance between two threads of one worker: "
                f"there is no pair to place nearer or farther; {fix}")
    D, core = inst.distance, np.asarray(inst.topology.core)
    apart = np.unique(D[core[:, None] != core[None, :]])
    if len(np.unique(D[np.triu_indices(inst.C, 1)])) == 1:
        return (f"every two cores of {name} are equally far apart (d = {apart[0]:g}), so no placement is "
                f"nearer than another; {fix}")
    if physical and W * T <= P and len(apart) <= 1:
        return (f"with the physical-core balance (8+) on, W x T = {W * T} <= P = {P} gives every thread a "
                f"physical core of its own, and all physical cores of {name} share the last cache level: "
                f"every two threads of a worker are equally far apart (d = {apart[0] if len(apart) else 0:g}) "
                f"whichever cores they get; {fix}")
    # "no different choice" would be false where a thread moves: the choice left is among equal spreads.
    return (f"the constraints leave scatter and compact no placement of a different spread here: both spread "
            f"each worker's threads {spread(scatter):g} apart in all; {fix}")


def _moves_among_equals(scatter, compact, moved):
    """What moves between two mappings of equal spread, in words: the one thread, or how many."""
    if moved == 1:
        w, t = (int(i) for i in np.argwhere(scatter.assignment != compact.assignment)[0])
        what = (f"1 thread moves (thread {t} of worker {w}: cpu {scatter.assignment[w, t]} in scatter, "
                f"{compact.assignment[w, t]} in compact)")
    else:
        what = f"{moved} of {scatter.assignment.size} threads move"
    alike = np.allclose(np.abs(worker_terms(scatter)), np.abs(worker_terms(compact)))
    whose = "every worker's spread is equal" if alike else "the workers' spreads add up to the same"
    return f"{what}, but {whose} ({spread(scatter):g}), a choice among equals"


def difference(scatter, compact, physical=True, time_limit=5.0):
    """One line: what differs between the two modes' mappings, or :func:`why_same` prefixed by what is equal.

    Where the spreads are equal but the solver placed some threads
    differently (``1 x 17`` on ``epyc-7313p``: one thread moves), the line
    says so rather than that the mappings are the same.

    Examples
    --------
    >>> from tuna_lab import solve
    >>> s, c = (solve(1, 17, "epyc-7313p", m) for m in ("scatter", "compact"))
    >>> print(difference(s, c).split("; the constraints")[0])
    scatter and compact: 1 thread moves (thread 16 of worker 0: cpu 20 in scatter, 17 in compact), but every worker's spread is equal (22954), a choice among equals
    """
    why = why_same(scatter, compact, physical, time_limit)
    moved = int((scatter.assignment != compact.assignment).sum())
    if why is not None and moved:
        return f"scatter and compact: {_moves_among_equals(scatter, compact, moved)}; {why}"
    if why is not None:
        return f"scatter and compact give the same spread ({spread(scatter):g}): {why}"
    parts = [f"scatter and compact differ: {moved} of {scatter.assignment.size} threads sit on other cores"]
    level, s_span = domains_spanned(scatter)
    _, c_span = domains_spanned(compact)
    if level and not np.isclose(s_span, c_span):
        parts.append(f"a worker spans {s_span:g} {level} domains in scatter, {c_span:g} in compact")
    s_sib, c_sib = own_siblings(scatter), own_siblings(compact)
    if s_sib != c_sib:
        parts.append(f"{s_sib} threads share a physical core with their own worker in scatter, {c_sib} in compact")
    parts.append(f"f_mode {scatter.f_mode:+g} vs {compact.f_mode:+g}")
    return "; ".join(parts)


def _mode_effect(w, wo, shown):
    """What the physical-core analogues change in one mode: ``w`` solved with them, ``wo`` without."""
    pw, pwo = w.physical_loads, wo.physical_loads
    mode = f"{w.mode} (shown)" if w.mode == shown else w.mode
    if np.array_equal(w.assignment, wo.assignment):
        return f"in {mode} they change nothing ({pw.min()}..{pw.max()} threads per physical core with them or without)"
    if np.array_equal(np.sort(pw), np.sort(pwo)) and own_siblings(w) == own_siblings(wo) \
            and np.isclose(w.f_mode, wo.f_mode):
        # other cores, the same counts: the solver's choice among equals, not the families' doing
        return (f"in {mode} they change neither the loads nor f_mode ({pw.min()}..{pw.max()} threads per "
                f"physical core with them or without)")
    return (f"in {mode}, without them {own_siblings(wo)} threads sit beside their own worker on one physical core "
            f"({own_siblings(w)} with them) and a physical core holds {pwo.min()}..{pwo.max()} threads "
            f"({pw.min()}..{pw.max()} with them), f_mode {wo.f_mode:+g} ({w.f_mode:+g} with them; summed cache "
            f"distance)")


def physical_effect(with_physical, without_physical, shown=None):
    """One line: what the physical-core analogues (8+), (11+-12+) change, in each mode given.

    Parameters
    ----------
    with_physical, without_physical : Mapping or sequence of Mapping
        The mappings solved with and without them: one, or one per mode
        (in the same order in both).
    shown : str, optional
        The mode on screen, marked ``(shown)`` in the line.

    Examples
    --------
    >>> from tuna_lab import solve
    >>> pair = [[solve(4, 4, "xeon-8272cl", m, families=families(on)) for m in ("scatter", "compact")]
    ...         for on in (True, False)]
    >>> print(physical_effect(*pair, shown="scatter").split(": ", 1)[1])
    in scatter (shown) they change nothing (1..1 threads per physical core with them or without); in compact, without them 8 threads sit beside their own worker on one physical core (0 with them) and a physical core holds 0..2 threads (1..1 with them), f_mode -832 (-1200 with them; summed cache distance)
    """
    withs = [with_physical] if hasattr(with_physical, "assignment") else list(with_physical)
    withouts = [without_physical] if hasattr(without_physical, "assignment") else list(without_physical)
    parts = [_mode_effect(w, wo, shown) for w, wo in zip(withs, withouts)]
    return ("the physical-core analogues (8+), (11+-12+) spread threads over physical cores as (8), (11-12) "
            "spread them over logical ones: " + "; ".join(parts))
