"""Two exact encodings of the same families as cvxpy variables.

``pairwise``
    The article's own: a binary ``Y[w, t, c]`` per thread and core, and one
    product variable per pair of cores for the distance terms (the binary
    products of (4), (6) and (11) linearised in full, as in the article).
    Faithful and readable, and slow beyond small machines: it is kept for
    teaching and cross-checking.

``counts``
    Exact and much smaller, built on three facts:

    1. *Ranks aggregate.* Beyond the main thread, the ranks ``t >= 1`` of a
       worker only matter through (2). Keep ``a[w, c]`` (main thread of ``w``
       on ``c``, binary) and ``b[w, c]`` (how many other threads of ``w`` run
       on ``c``). For ranks ``1..T-1``, (2) holds for *some* numbering of the
       threads iff every core carries at most ``cap * (T - 1)`` non-main
       threads: the threads form a bipartite multigraph workers x cores in
       which every worker has degree ``T - 1``, and an equitable
       ``(T-1)``-edge-colouring (de Werra) gives each worker every rank once
       and each core at most ``ceil(deg/(T-1)) <= cap`` threads of a rank.
       :func:`~tuna_lab.model.ranks.assign_ranks` recovers such a numbering.
    2. *The distance is an ultrametric over the cache tree.* For counts
       ``x_c`` with total ``X``, ``sum_{c<c'} x_c x_c' d(c,c')`` equals
       ``1/2 [d_top X^2 - sum_l (d_{l+1} - d_l) S_l - d_1 S_0]`` where
       ``S_l = sum_{D in level l} X_D^2`` over the cache domains of level
       ``l`` (``S_0`` over single cores). No product of two cores remains:
       maximising the distance minimises a separable convex function of the
       domain counts (tangent rows at integer break points, no binaries);
       minimising it (compact) maximises one, which takes incremental
       binaries ``z_{D,k} = [X_D >= k]``.
    3. *Workers are interchangeable.* Every family of the article is
       invariant under renumbering workers (and permuting interchangeable
       cores), so worker ``w``'s main thread may be required to sit on a
       core position no later than worker ``w+1``'s. A family that is not
       says so (``Family.symmetric = False``) and the model keeps every
       symmetry.

    (9)+(10) are substituted out when (2) makes ``A_c`` binary (then
    ``M_c = A_c``), and (11) is linearised one-sidedly (only ``E_c >= ...``:
    (12) bounds the events from above, so the solver never gains by raising
    ``E_c``).
"""

import abc

import lazy_loader
import numpy as np
import scipy.sparse as sp

from ..errors import ModelError
from .families import loads, main_counts, worker_counts
from .ranks import assign_ranks

# cvxpy takes most of a second to import; a compact solve that the constructive route
# proves never builds the cvxpy problem, so it is loaded on first use
cp = lazy_loader.load("cvxpy")

__all__ = ["Encoding", "PairwiseEncoding", "CountEncoding", "ENCODINGS", "ultrametric_chain",
           "make_encoding"]


def _membership(labels):
    """Sparse (C, n_groups) 0/1 matrix with a 1 at (c, labels[c])."""
    labels = np.asarray(labels)
    C = labels.size
    n = int(labels.max()) + 1 if C else 0
    return sp.csr_matrix((np.ones(C), (np.arange(C), labels)), shape=(C, n))


def ultrametric_chain(topology, costs=None):
    """Nested partitions of the cores with the distance of pairs first joined at each.

    Returns a list ``[(d_j, labels_j)]`` from the cache level closest to the
    cores to the whole machine: a pair of distinct cores is at distance
    ``d_j`` for the first ``j`` whose partition puts them together. Raises
    :class:`~tuna_lab.errors.TopologyError` when the caches are not nested. ``topology``
    is anything :func:`~tuna_lab.machine.topology_from` takes.
    """
    from ..machine.spec import topology_from

    topology = topology_from(topology)
    costs = {**topology.costs, **(costs or {})}
    chain = [(float(d), np.asarray(lab)) for d, lab in topology.levels(costs)]
    C = topology.n_logical
    if not chain or len(np.unique(chain[-1][1])) > 1:
        chain.append((float(costs["none"]), np.zeros(C, dtype=int)))
    return chain


class Encoding(abc.ABC):
    """The contract between the families and an encoding: every member a family may use.

    A family builds its rows only from the attributes and methods below, so
    any family - the article's or a user's - composes with every encoding,
    and an encoding is complete when it implements every abstract method
    (Python refuses to instantiate it otherwise). The model itself uses the
    last four (:meth:`symmetry_constraints`, :meth:`extract`,
    :meth:`canonical`, :meth:`start`).

    Auxiliary objects (indicators, product variables, the linearisation of
    a pair sum) are built once per encoding: every call returns the same
    expression with the same defining rows. The family that *owns* a
    definition returns those rows from its ``constraints``; the others only
    read the expression.

    Parameters
    ----------
    inst : Instance
    caps : Caps
        The model's rules (:class:`~tuna_lab.model.caps.Caps`): they size the
        variables (largest ``A_c`` and ``B_wc``), the domains' capacities and
        the rank recovery.

    Attributes
    ----------
    name : str
        ``"pairwise"`` or ``"counts"``: what :attr:`Mapping.encoding` reports.
    inst : Instance
    caps : Caps
    main_count : cvxpy expression, shape (C,)
        ``A_c``, main threads on core ``c``.
    worker_count : cvxpy expression, shape (W, C)
        ``B_wc``, threads of worker ``w`` on core ``c``.
    load : cvxpy expression, shape (C,)
        ``N_c``, threads on core ``c``.
    physical_matrix : scipy.sparse matrix, shape (C, P)
        Membership of logical cores in physical cores (``load @ physical_matrix``
        are the physical loads).
    """

    name = ""

    def __init__(self, inst, caps):
        self.inst = inst
        self.caps = caps
        self.physical_matrix = _membership(inst.core)
        self._vars = []
        self._made = {}

    def _once(self, key, build):
        """``build()`` on the first request of ``key``; the same object afterwards."""
        if key not in self._made:
            self._made[key] = build()
        return self._made[key]

    def variables(self):
        """Every cvxpy variable created so far (the decision variables first)."""
        return list(self._vars)

    @abc.abstractmethod
    def assignment_constraints(self):
        """Rows: every thread on exactly one core."""

    @abc.abstractmethod
    def rank_cap(self, cap):
        """Rows: at most ``cap`` threads of one rank on each core."""

    @abc.abstractmethod
    def worker_cap(self, cap):
        """Rows: at most ``cap`` threads of one worker on each core."""

    @abc.abstractmethod
    def main_indicator(self):
        """``(M, rows)``: ``M_c`` = some main thread is on core ``c``, and the rows that define it."""

    @abc.abstractmethod
    def physical_main_indicator(self):
        """``(M+, rows)``: ``M+_x`` = some main thread is on physical core ``x``, and its definition."""

    @abc.abstractmethod
    def product(self, excess, indicator, label):
        """``(E, rows)``: ``E`` = the product of two 0-1 expressions, ``excess * indicator``, linearised.

        ``label`` names the variables (one product per label).
        """

    @abc.abstractmethod
    def pair_sum(self, label, counts, maximize):
        """``(expr, rows)``: ``sum_rows sum_{c<c'} X_c X_c' d(c,c')`` of ``counts`` (k, C).

        ``label`` ("main" or "worker") says which count it is (its largest
        value per core comes from :attr:`caps`); ``maximize`` whether the
        objective raises it, which lets a linearisation be one-sided.
        """

    @abc.abstractmethod
    def symmetry_constraints(self):
        """Rows that break symmetries all the families share (none unless ``caps.symmetric``)."""

    @abc.abstractmethod
    def extract(self):
        """The solved assignment as core positions, shape (W, T)."""

    @abc.abstractmethod
    def canonical(self, assign):
        """``assign`` renumbered to satisfy :meth:`symmetry_constraints` (same objective)."""

    @abc.abstractmethod
    def start(self, assign):
        """``{variable id: value}`` of the integer decision variables for ``assign`` (a warm start)."""


class PairwiseEncoding(Encoding):
    """The article's encoding: ``Y[w, t*C + c]`` binary, products of core pairs linearised."""

    name = "pairwise"

    def __init__(self, inst, caps):
        super().__init__(inst, caps)
        W, T, C = inst.W, inst.T, inst.C
        self.Y = cp.Variable((W, T * C), boolean=True, name="Y")
        # column t*C + c  ->  core c  /  thread t
        self._to_core = sp.kron(np.ones((T, 1)), sp.identity(C), format="csr")
        self._to_thread = sp.kron(sp.identity(T), np.ones((C, 1)), format="csr")
        self.main_count = cp.sum(self.Y[:, :C], axis=0)
        self.worker_count = self.Y @ self._to_core
        self.load = cp.sum(self.worker_count, axis=0)
        self._vars.append(self.Y)

    def assignment_constraints(self):
        return [self.Y @ self._to_thread == 1]

    def rank_cap(self, cap):
        return [cp.sum(self.Y, axis=0) <= cap]

    def worker_cap(self, cap):
        return [self.worker_count <= cap]

    def main_indicator(self):
        return self._once("main_indicator", self._main_indicator)

    def _main_indicator(self):
        C, W = self.inst.C, self.inst.W
        M = cp.Variable(C, boolean=True, name="M")
        self._vars.append(M)
        return M, [self.Y[:, :C] <= np.ones((W, 1)) @ cp.reshape(M, (1, C), order="C"),  # (9)
                   M <= self.main_count]                                                   # (10)

    def physical_main_indicator(self):
        return self._once("physical_main_indicator", self._physical_main_indicator)

    def _physical_main_indicator(self):
        inst = self.inst
        Mp = cp.Variable(inst.P, boolean=True, name="M_phys")
        self._vars.append(Mp)
        per_core = Mp @ self.physical_matrix.T
        return Mp, [self.Y[:, :inst.C] <= np.ones((inst.W, 1)) @ cp.reshape(per_core, (1, inst.C), order="C"),
                    Mp <= self.main_count @ self.physical_matrix]

    def product(self, excess, indicator, label):
        return self._once(("events", label), lambda: self._events(excess, indicator, label))

    def _events(self, excess, indicator, label):
        # Full linearisation of the product of two 0-1 quantities, as written.
        E = cp.Variable(excess.shape, name=f"E_{label}")
        self._vars.append(E)
        return E, [E >= excess + indicator - 1, E >= 0, E <= excess, E <= indicator]

    def pair_sum(self, label, counts, maximize):
        """``sum_rows sum_{c<c'} X_c X_c' d(c,c')`` through one product variable per core pair."""
        return self._once(("pair_sum", label, maximize), lambda: self._pair_sum(label, counts))

    def _pair_sum(self, label, counts):
        inst = self.inst
        C = inst.C
        i, j = np.triu_indices(C, 1)
        d = inst.distance[i, j]
        sel_i = sp.csr_matrix((np.ones(i.size), (i, np.arange(i.size))), shape=(C, i.size))
        sel_j = sp.csr_matrix((np.ones(j.size), (j, np.arange(j.size))), shape=(C, j.size))
        m = self.caps.main_max if label == "main" else self.caps.worker_max
        k = counts.shape[0]
        cons = []
        if m <= 1:
            units = [counts]
        else:
            # X_c = sum_u G_u[c], G_u = [X_c >= u]: products of integers become
            # products of 0-1 indicators.
            units = [cp.Variable((k, C), boolean=True, name=f"G_{label}_{u}") for u in range(m)]
            self._vars.extend(units)
            cons.append(counts == sum(units))
            cons.extend(units[u] >= units[u + 1] for u in range(m - 1))
        total = 0
        for gu in units:
            for gv in units:
                Z = cp.Variable((k, i.size), name=f"Z_{label}")
                self._vars.append(Z)
                left, right = gu @ sel_i, gv @ sel_j
                cons += [Z <= left, Z <= right, Z >= left + right - 1, Z >= 0]
                total = total + cp.sum(Z @ d)
        return total, cons

    def symmetry_constraints(self):
        # The article's literal model: kept as written, symmetries and all.
        return []

    def extract(self):
        W, T, C = self.inst.W, self.inst.T, self.inst.C
        Y = np.asarray(self.Y.value).reshape(W, T, C)
        return np.argmax(Y, axis=2)

    def canonical(self, assign):
        # No symmetry rows: every assignment is canonical.
        return np.asarray(assign)

    def start(self, assign):
        W, T, C = self.inst.W, self.inst.T, self.inst.C
        Y = np.zeros((W, T, C))
        np.put_along_axis(Y, np.asarray(assign)[:, :, None], 1.0, axis=2)
        return {self.Y.id: Y.reshape(W, T * C)}


class CountEncoding(Encoding):
    """Aggregated ranks and per-domain counts; see the module docstring for why it is exact.

    ``chain`` is the topology's :func:`ultrametric_chain`.
    """

    name = "counts"

    def __init__(self, inst, caps, chain):
        super().__init__(inst, caps)
        W, T, C = inst.W, inst.T, inst.C
        self.chain = chain
        self.a = cp.Variable((W, C), boolean=True, name="a")
        self._vars.append(self.a)
        if T > 1:
            ub = min(T - 1, caps.worker_max)
            self.b = cp.Variable((W, C), integer=True, name="b", bounds=[0, ub])
            self._vars.append(self.b)
            self.worker_count = self.a + self.b
        else:
            self.b = None
            self.worker_count = self.a
        self.main_count = cp.sum(self.a, axis=0)
        self.load = cp.sum(self.worker_count, axis=0)

    def assignment_constraints(self):
        cons = [cp.sum(self.a, axis=1) == 1]
        if self.b is not None:
            cons.append(cp.sum(self.b, axis=1) == self.inst.T - 1)
        return cons

    def rank_cap(self, cap):
        cons = [self.main_count <= cap]
        if self.b is not None:
            cons.append(cp.sum(self.b, axis=0) <= cap * (self.inst.T - 1))
        return cons

    def worker_cap(self, cap):
        return [self.worker_count <= cap] if (self.b is not None and cap < self.inst.T) else []

    def symmetry_constraints(self):
        """Break the symmetries of workers, of sibling cores and of interchangeable physical cores.

        * Worker ``w``'s main thread sits at a core position <= worker ``w+1``'s.
        * Among the SMT siblings of a physical core, and among the physical
          cores sharing the same next cache domain (same sibling count), a
          key ``(W*T+1) * A + N`` (main threads, then load) does not increase
          with the position.

        Each is valid alone and together: permuting interchangeable cores to
        sort them by the key is a symmetry of every family, the physical
        key is the sum of its siblings' keys (so sorting siblings keeps it),
        and renumbering workers afterwards changes no key. Only when every
        family says it is invariant under these (``caps.symmetric``).
        """
        if not self.caps.symmetric:
            return []
        inst = self.inst
        cons = []
        if inst.W >= 2:
            pos = self.a @ np.arange(inst.C, dtype=float)
            cons.append(pos[:-1] <= pos[1:])
        big = inst.W * inst.T + 1
        key = big * self.main_count + self.load
        sib_pairs = _consecutive_pairs(inst.core, np.arange(inst.C))
        if sib_pairs is not None:
            cons.append(key @ sib_pairs >= 0)
        parent = self._physical_parent()
        if parent is not None:
            smt = np.bincount(inst.core)
            group = parent * (smt.max() + 1) + smt          # only same-shaped cores swap
            pairs = _consecutive_pairs(group, np.arange(inst.P))
            if pairs is not None:
                cons.append((key @ self.physical_matrix) @ pairs >= 0)
        return cons

    def _physical_parent(self):
        """Label, per physical core, of the first cache domain strictly coarser than it."""
        core = self.inst.core
        for _, labels in self.chain:
            parent = _parent_of(core, labels)
            if len(np.unique(parent)) < self.inst.P:
                return parent
        return None

    def main_indicator(self):
        return self._once("main_indicator", self._main_indicator)

    def _main_indicator(self):
        if self.caps.main_max <= 1:
            # (2) makes A_c binary: M_c = A_c satisfies (9) and (10) exactly.
            return self.main_count, []
        W, C = self.inst.W, self.inst.C
        M = cp.Variable(C, boolean=True, name="M")
        self._vars.append(M)
        # (9) per worker, as the article writes it: tighter in the LP
        # relaxation than the aggregated big-M form A_c <= W M_c.
        return M, [self.a <= np.ones((W, 1)) @ cp.reshape(M, (1, C), order="C"), M <= self.main_count]

    def physical_main_indicator(self):
        return self._once("physical_main_indicator", self._physical_main_indicator)

    def _physical_main_indicator(self):
        inst = self.inst
        Mp = cp.Variable(inst.P, boolean=True, name="M_phys")
        self._vars.append(Mp)
        per_phys = self.main_count @ self.physical_matrix
        # M+_x >= a[w, c] for every c in x (disaggregated, tight in the LP)
        per_core = cp.reshape(Mp @ self.physical_matrix.T, (1, inst.C), order="C")
        return Mp, [self.a <= np.ones((inst.W, 1)) @ per_core, Mp <= per_phys]

    def product(self, excess, indicator, label):
        return self._once(("events", label), lambda: self._events(excess, indicator, label))

    def _events(self, excess, indicator, label):
        E = cp.Variable(excess.shape, name=f"E_{label}", nonneg=True)
        self._vars.append(E)
        return E, [E >= excess + indicator - 1]

    def _squares(self, X, kmax, label, exact, capacity=None):
        """``(expr, rows)``: ``sum X_D^2`` over the entries of ``X`` (integers in 0..kmax).

        ``exact=False``: a lower bound tight when minimised (epigraph of the
        tangents at integer points). ``exact=True``: equal to it at every
        integer point, via incremental binaries (needed when maximised).
        """
        if kmax <= 1:
            return cp.sum(X), []
        if not exact:
            q = cp.Variable(X.shape, name=f"q_{label}")
            self._vars.append(q)
            return cp.sum(q), [q >= (2 * k + 1) * X - k * (k + 1) for k in range(kmax)]
        rows, n_dom = X.shape
        Z = cp.Variable((rows * n_dom, kmax), boolean=True, name=f"z_{label}")
        self._vars.append(Z)
        cons = [cp.sum(Z, axis=1) == cp.vec(X, order="F"), Z[:, :-1] >= Z[:, 1:]]
        if capacity is not None and rows > 1:
            # Valid cuts that the LP relaxation misses: at most floor(cap_D / k)
            # rows (workers) can hold k or more threads in a domain that holds
            # at most cap_D threads in all. Without them the relaxation
            # believes every worker can fill its domains at once.
            k = np.arange(1, kmax + 1)
            limit = np.floor(np.asarray(capacity, float)[:, None] / k[None, :])
            # rows of Z are ordered (row, domain) column-major: row index fastest
            per_domain = sp.kron(sp.identity(n_dom), np.ones((1, rows)), format="csr")
            cons.append(per_domain @ Z <= limit)
        return cp.sum(Z @ (2.0 * np.arange(1, kmax + 1) - 1)), cons

    def pair_sum(self, label, counts, maximize):
        """``sum_rows sum_{c<c'} X_c X_c' d(c,c')`` from per-domain counts (module docstring, 2.)."""
        return self._once(("pair_sum", label, maximize), lambda: self._pair_sum(label, counts, maximize))

    def _pair_sum(self, label, counts, maximize):
        inst = self.inst
        k = counts.shape[0]
        per_core_max = self.caps.main_max if label == "main" else self.caps.worker_max
        total = inst.W if label == "main" else inst.T
        exact = not maximize
        d = [0.0] + [c for c, _ in self.chain]       # d[0]: "same core" does not count in c<c'
        labels = [None] + [lab for _, lab in self.chain]
        top = len(d) - 1
        expr = 0.5 * d[top] * total * total * k
        cons = []
        X, prev = counts, np.arange(inst.C)
        for j in range(top):
            weight = d[j + 1] - d[j]
            G = sp.identity(inst.C, format="csr") if j == 0 else _membership(labels[j])
            if j > 0:
                # Domain counts as variables, each summed from the level below:
                # a few nonzeros per row instead of one per core of the domain.
                H = _membership(_parent_of(prev, labels[j]))
                Xj = cp.Variable((k, H.shape[1]), name=f"X_{label}{j}")
                self._vars.append(Xj)
                cons.append(Xj == X @ H)
                X, prev = Xj, labels[j]
            if weight == 0:
                continue
            sizes = np.asarray(G.sum(axis=0)).ravel()
            kmax = int(min(total, sizes.max() * per_core_max))
            capacity = self.domain_capacity(G) if label == "worker" else None
            squares, rows = self._squares(X, kmax, f"{label}{j}", exact, capacity)
            expr = expr - 0.5 * weight * squares
            cons.extend(rows)
        return expr, cons

    def domain_capacity(self, G):
        """Most threads the load families allow in each domain (columns of ``G``)."""
        inst, caps = self.inst, self.caps
        per_core = np.full(inst.C, float(inst.W * inst.T))
        if caps.load is not None:
            per_core = np.minimum(per_core, caps.load[1])
        cap = per_core @ G
        if caps.phys_load is not None:
            # physical cores wholly inside each domain
            phys_in = (self.physical_matrix.T @ G).toarray() > 0
            cap = np.minimum(cap, phys_in.sum(axis=0) * caps.phys_load[1])
        return np.minimum(cap, inst.W * inst.T)

    def extract(self):
        a = np.rint(np.asarray(self.a.value)).astype(int)
        main = np.argmax(a, axis=1)
        if self.b is None:
            return main[:, None]
        b = np.rint(np.asarray(self.b.value)).astype(int)
        return assign_ranks(main, b, self.caps.rank_limit)

    def canonical(self, assign):
        """``assign`` renumbered so that it satisfies :meth:`symmetry_constraints`.

        Physical cores of one interchangeable group are reordered by their
        key, and the siblings of each by theirs (both symmetries of every
        family, which keep the objective), then the workers by the position
        of their main thread. A warm start must be canonical, else HiGHS
        finds it infeasible and discards it. Without symmetry rows
        (``caps.symmetric`` false) every assignment is canonical.
        """
        inst = self.inst
        assign = np.asarray(assign)
        if not self.caps.symmetric:
            return assign
        W, T, C = inst.W, inst.T, inst.C
        key = (W * T + 1) * main_counts(assign, C) + loads(assign, C)
        core = inst.core
        members = [np.flatnonzero(core == x) for x in range(inst.P)]   # ascending positions
        pkey = np.bincount(core, weights=key, minlength=inst.P)
        parent = self._physical_parent()
        smt = np.bincount(core, minlength=inst.P)
        if parent is None:
            group = np.arange(inst.P)
        else:
            group = parent * (smt.max() + 1) + smt
        new = np.arange(C)
        for g in np.unique(group):
            phys = np.flatnonzero(group == g)
            order = phys[np.argsort(-pkey[phys], kind="stable")]
            for src, dst in zip(order, phys):
                cores = members[src]
                new[cores[np.argsort(-key[cores], kind="stable")]] = members[dst]
        out = new[assign]
        return out[np.argsort(out[:, 0], kind="stable")]

    def start(self, assign):
        assign = self.canonical(assign)
        W, C = self.inst.W, self.inst.C
        a = np.zeros((W, C))
        a[np.arange(W), assign[:, 0]] = 1
        out = {self.a.id: a}
        if self.b is not None:
            out[self.b.id] = worker_counts(assign, C) - a
        return out


def _consecutive_pairs(groups, members):
    """Sparse (n, k) matrix: column j = e_first - e_second for consecutive members of a group."""
    groups = np.asarray(groups)
    order = np.lexsort((members, groups))
    g = groups[order]
    same = np.flatnonzero(g[:-1] == g[1:])
    if same.size == 0:
        return None
    first, second = order[same], order[same + 1]
    n = groups.size
    data = np.concatenate([np.ones(same.size), -np.ones(same.size)])
    rows = np.concatenate([first, second])
    cols = np.concatenate([np.arange(same.size)] * 2)
    return sp.csr_matrix((data, (rows, cols)), shape=(n, same.size))


def _parent_of(child_labels, parent_labels):
    """For each child domain, the parent domain containing it (partitions must nest)."""
    n = int(np.max(child_labels)) + 1
    out = np.zeros(n, dtype=int)
    out[np.asarray(child_labels)] = np.asarray(parent_labels)
    return out


ENCODINGS = ("auto", "counts", "pairwise")


def make_encoding(name, inst, caps):
    """The :class:`Encoding` ``name`` of ``inst`` under ``caps`` ("auto": counts where the caches nest)."""
    if name not in ENCODINGS:
        raise ModelError(f"encoding must be one of {', '.join(ENCODINGS)}, got {name!r}")
    if name in ("auto", "counts"):
        try:
            chain = ultrametric_chain(inst.topology, inst.costs)
        except ValueError:
            if name == "counts":
                raise
            chain = None
        if chain is not None:
            return CountEncoding(inst, caps, chain)
    return PairwiseEncoding(inst, caps)
