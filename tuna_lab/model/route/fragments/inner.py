"""The finer levels' bound of a domain pattern (SMT siblings under a shared L3), for the joint program.

:func:`inner_rule` gives each column of level 2 a bound of its domain's
two finer levels, read from its pattern alone, so that one program bounds
levels 0..2 together (tighter than each level on its own).
"""

import numpy as np

__all__ = ["inner_rule"]


def inner_rule(caps, chain, j):
    """The bound of a domain's two finer levels (SMT siblings) from its pattern, or ``None``.

    Applies when level ``j`` is 2, its sub-domains are physical cores of two
    SMT siblings (level 1) and a worker or a rank has at most one thread per
    logical core; then the single-core level is fixed by the counts and the
    physical-core level reads same-worker sibling pairs and main threads
    sharing a physical core. A domain of ``npc`` physical cores with ``n``
    threads and ``a`` mains has at most ``npc * min(U, U+ // 2, f)`` worker
    pairs (one pair takes a thread on both siblings, and a worker has at
    most one on a physical core: ``f`` is its fragments of two or more
    threads) and at most ``floor(x / 2)`` per fragment of ``x``; a main's physical core carries
    only ``L+`` unless it spends an event of (12+), which caps how many
    physical cores the mains can take, so at least ``a - q_max`` of them
    share one - where, under (12) with no event left, the two mains are the
    only threads there and no worker pair fits. A main alone on its logical
    core in a fragment of one thread leaves its physical core without a
    pair too.
    """
    inst = caps.instance
    if j != 2 or len(chain) < 2 or caps.worker_max > 1 or caps.main_max > 1:
        return None
    if not (inst.P * 2 == inst.C and np.all(inst.smt == 2)):
        return None
    first = np.asarray(chain[0][1])
    if len(np.unique(first)) != inst.P or \
            len(np.unique(np.stack([first, inst.core]), axis=1).T) != inst.P:
        return None
    d1, d2 = chain[0][0], chain[1][0]
    w0, w1 = d1, d2 - d1
    s, use_main = caps.sign, caps.spread_main
    U = caps.load[1] if caps.load is not None else inst.W
    phys = caps.phys_load
    # a pair takes a thread on both siblings, so a physical core holds at most as many pairs as a
    # sibling holds threads (U), and half what (8+) lets it carry - one per worker, but with U = 2
    # two workers can each have one there
    per_core = max(0, min(U, phys[1] // 2) if phys is not None else U)
    events = caps.phys_event_budget is not None and phys is not None and phys[1] > phys[0]
    balanced = phys is not None and phys[1] - phys[0] <= 1
    # a main on a physical core at L+ = 1 (no event) is alone there: its own fragment pairs one thread fewer
    alone_phys = events and phys[0] == 1

    def inner(vec, n, a, el, ep, npc, other):
        # numpy's element-wise min/max: ``vec`` may be one pattern or a table of them (rows), ``n`` their sizes
        # a worker holds at most one pair on a physical core: no more pairs there than fragments of two or more
        duos = vec.sum(axis=-1) - vec[..., 0]
        halves = vec @ (np.arange(1, vec.shape[-1] + 1) // 2)
        if alone_phys:
            halves = halves - _lone_main_loss(vec, n, a, ep, npc, other)
        pairs = np.minimum(npc * np.minimum(per_core, duos), halves)
        if balanced:
            # (8+) holds each physical core at L+ or U+ threads: ``n`` fixes how many carry U+, and a
            # core of ``l`` threads holds at most ``l // 2`` pairs
            up = np.clip(n - npc * phys[0], 0, npc)
            pairs = np.minimum(pairs, (npc - up) * (phys[0] // 2) + up * (phys[1] // 2))
        shared = 0                  # physical cores two mains must share
        if events:
            q_max = (npc * phys[1] - n) // (phys[1] - phys[0]) + ep
            shared = np.maximum(0, a - q_max)
        # mains alone on their logical core: under (8) with U = 1, or under (12) with no event here
        alone = caps.load is not None and (U == 1 or (caps.event_budget is not None and el == 0
                                                      and caps.load[0] == 1))
        if alone:
            pairs = _lone_main_pairs(pairs, duos, a, npc, np.minimum(per_core, duos), shared, use_main,
                                     vec=vec, halves=halves, low=caps.load[0])
        else:
            pairs = pairs - (shared if use_main else 0)
        # ``pairs`` is now the most of (sibling pairs - mains sharing a physical core), what level 1 reads
        level0 = -0.5 * w0 * ((a if use_main else 0) + s * n)
        level1 = -0.5 * w1 * ((a if use_main else 0) + s * n) - s * w1 * pairs
        return level0 + level1

    # what the column generation's pricing needs to bound it from above (compact mode: s = -1):
    # per thread, per possible sibling pair, and per main (shared mains only lower it)
    inner.per_thread = -0.5 * (w0 + w1) * s
    inner.per_pair = -w1 * s
    inner.per_main = -0.5 * (w0 + w1) * (1 if use_main else 0)
    inner.per_core = per_core
    return inner


def _lone_main_loss(vec, n, a, ep, npc, other):
    """The fewest pairs a domain's fragments lose to mains alone on their physical core (L+ = 1).

    ``vec``: fragment counts (one pattern or rows of them) of ``n`` threads
    on ``npc`` physical cores; ``a`` mains, all alone but those on the ``ep``
    event cores (load U+ = 2), of which one per core may pair with its own
    worker. Two mains on an event core pair with neither, and the mains the
    ``2 npc - n`` cores at L+ do not seat must double up so. A main without
    a pair takes one thread of its fragment out of the pairing, which costs
    a fragment of even size one pair and an odd one none. Mains lie in
    distinct fragments, every fragment bigger than ``other`` holds one, and
    the others go to odd fragments first; the mains paired on event cores
    spare even fragments first.
    """
    vec = np.asarray(vec)
    sizes = np.arange(1, vec.shape[-1] + 1)
    even, big = sizes % 2 == 0, sizes > other
    must_even = vec @ (even & big)
    must = vec @ big
    odd_free = vec @ (~even & ~big)
    extra_even = np.maximum(0, (a - must) - odd_free)
    doubled = np.maximum(0, a - np.maximum(0, 2 * npc - n) - ep)
    spared = np.minimum(a, np.maximum(0, ep - doubled))
    return np.maximum(0, must_even + extra_even - spared)


def _lone_main_pairs(pairs, duos, a, npc, per_core, shared, use_main, vec=None, halves=None, low=0):
    """The most sibling pairs less mains sharing a physical core, of a domain whose mains are alone
    on their logical cores.

    ``pairs``: the most pairs the fragments hold (``floor(x / 2)`` each,
    ``per_core`` per physical core; one per pattern or one per row of them,
    like ``duos``, the fragments of two or more threads). A main alone on its logical core leaves
    its physical core at most one pair, its own worker's, and none when its
    fragment is of one thread; two mains on one physical core leave it none.
    With ``c2`` physical cores holding two mains (at least ``shared``) and
    ``c1 = a - 2 c2`` holding one, the cores hold at most
    ``per_core (npc - c1 - c2) + min(1, per_core) (c1 - m1)`` pairs, where ``m1`` (the mains in
    fragments of one thread on a ``c1`` core) is at least ``a`` less the
    fragments of two or more threads, less ``2 c2``. The most of
    ``pairs - c2`` (the physical level reads both; ``pairs`` alone without
    (4-5)) over every ``c2``.

    With ``vec`` (the fragment counts), ``halves`` (the most pairs the
    fragments hold, ``floor(x / 2)`` each) and ``low`` (the least threads a
    logical core carries, ``L``): a single-thread main alone on its physical
    core's one sibling leaves the other sibling ``low`` threads of other
    workers, which pair with nothing. An odd fragment, or one of one thread
    without a main, gives one such thread for free; past those, every two
    cost a pair.
    """
    singles = np.maximum(0, a - duos)
    free = 0
    if vec is not None and low > 0:
        sizes = np.arange(1, vec.shape[-1] + 1)
        free = vec @ ((sizes % 2 == 1) & (sizes > 1)) + np.maximum(0, vec[..., 0] - singles)
    best = np.full(np.shape(pairs), -np.inf)
    for c2 in range(0, a // 2 + 1):
        c1 = a - 2 * c2
        if c1 + c2 > npc:
            continue
        # (singles beyond what the c2 cores seat are on c1 cores: at most c1 of them, as singles <= a)
        m1 = np.maximum(0, singles - 2 * c2)
        held = np.minimum(pairs, per_core * (npc - c1 - c2) + np.minimum(1, per_core) * (c1 - m1))
        if vec is not None and low > 0:
            given = np.maximum(0, low * m1 - free)
            held = np.minimum(held, halves - (given + 1) // 2)
        value = held - (c2 if use_main else 0)
        best = np.where(c2 >= shared, np.maximum(best, value), best)
    # no way to seat the mains: the pattern cannot occur, any finite value bounds it
    return np.where(np.isfinite(best), best, pairs - (shared if use_main else 0))

