"""The cvxpy problem a model declares, built from its families' rows, and the cache that keeps it.

Examples
--------
>>> from tuna_lab import Topology, TunaModel
>>> cache = BuildCache(maxsize=2)
>>> model = TunaModel(2, 2, Topology.preset("xeon-8272cl"))
>>> problem, encoding, seconds = cache.build(model)
>>> cache.build(TunaModel(2, 2, Topology.preset("xeon-8272cl")))[0] is problem   # declared alike
True
>>> len(cache)
1
"""

import time
from collections import OrderedDict

import lazy_loader
import numpy as np

from .encodings import make_encoding

# cvxpy takes most of a second to import; a compact solve that the constructive route
# proves never builds the cvxpy problem, so it is loaded on first use
cp = lazy_loader.load("cvxpy")

__all__ = ["BuildCache", "BUILD_CACHE", "build_problem"]


def build_problem(model):
    """``(problem, encoding)``: the cvxpy problem of ``model`` (a :class:`~tuna_lab.model.tuna.TunaModel`).

    Every family returns all its rows (auxiliary definitions included); an
    objective family's term reuses the variables its rows define.
    """
    enc = make_encoding(model.encoding, model.instance, model.caps)
    constraints = [row for fam in model.families for row in fam.constraints(enc)]
    terms = [fam.term(enc) for fam in model.families if fam.kind == "objective"]
    constraints.extend(enc.symmetry_constraints())
    objective = cp.Maximize(sum(terms) if terms else cp.Constant(0.0))
    return cp.Problem(objective, constraints), enc


def _topology_key(topo):
    caches = tuple((k, np.asarray(v).tobytes()) for k, v in sorted(topo.caches.items()))
    # NUMA nodes matter once a remote cost prices them.
    return (topo.name, tuple(topo.cpus), np.asarray(topo.core).tobytes(), np.asarray(topo.numa).tobytes(), caches,
            tuple(sorted(topo.costs.items())))


class BuildCache:
    """Built cvxpy problems, by the declaration of the model they come from; the least recently used go first.

    Toggling a mode or a family back and forth re-solves without
    re-building or re-compiling: cvxpy caches the compiled problem on the
    ``Problem`` object this cache keeps.

    Keying: a model's declaration, by value - its encoding, ``W``, ``T``,
    mode, the topology's contents (name, CPUs, cores, NUMA nodes, caches,
    costs), the cost overrides, and its families' keys and classes. Two
    models declared alike share one problem, whichever objects they are.

    Lifetime: :data:`BUILD_CACHE`, the one the models use, lives as long as
    the process and holds at most ``maxsize`` problems (a notebook explores
    a few at a time; a large one takes hundreds of MB). :meth:`clear` empties it.

    Parameters
    ----------
    maxsize : int
        Most problems kept.
    """

    def __init__(self, maxsize=32):
        self.maxsize = maxsize
        self._built = OrderedDict()

    @staticmethod
    def key(model):
        """The cache key of ``model``: its declaration (see the class's text)."""
        inst = model.instance
        costs = tuple(sorted((inst.costs or {}).items()))
        return (model.encoding, inst.W, inst.T, inst.mode, _topology_key(inst.topology), costs,
                tuple(f.key for f in model.families), tuple(type(f) for f in model.families))

    def get(self, model):
        """``(problem, encoding)`` of ``model`` if built, else ``None``."""
        key = self.key(model)
        if key not in self._built:
            return None
        self._built.move_to_end(key)
        return self._built[key]

    def build(self, model):
        """``(problem, encoding, seconds)``: the cached problem (0 seconds) or a new one, kept."""
        cached = self.get(model)
        if cached is not None:
            return cached + (0.0,)
        t0 = time.perf_counter()
        built = build_problem(model)
        self._built[self.key(model)] = built
        if len(self._built) > self.maxsize:
            self._built.popitem(last=False)
        return built + (time.perf_counter() - t0,)

    def clear(self):
        """Forget every problem."""
        self._built.clear()

    def __len__(self):
        return len(self._built)


#: The cache :meth:`TunaModel.build <tuna_lab.model.tuna.TunaModel.build>` uses: one per process.
BUILD_CACHE = BuildCache()
