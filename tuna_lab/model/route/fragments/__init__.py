"""How workers split over the cache domains of one level: a bound, and the mapping it points to.

In compact mode each worker wants its threads in few domains of a cache
level (an L3, say), while the main threads want to be spread over them and
the load families cap what a domain holds. A worker's threads in one domain
form a *fragment*; its fragments over the level's domains are a partition
of its ``T`` threads, and a domain's fragments a partition of the threads it
carries. The level's part of the objective, ``-1/2 wt (a^2 - sum x^2)`` per
domain (``a`` main threads, fragments of ``x`` threads), depends on nothing
else.

Domains of one size and workers are interchangeable, so the best split is
a small integer program over *how many* domains take each pattern (a
partition of their threads into fragments, with ``a`` mains and the events
of (12)/(12+) they use) and how many workers each partition of ``T``, with
the fragments of each size counted equal on both sides - the cutting-stock
form. Its optimum bounds the level (:meth:`.FragmentProgram.solve`; the
relaxation forgets which worker is which and the cores inside a domain),
and its solution is a plan: :func:`.fragment_mapping` deals the fragments to
workers and domains and places each domain's fragments on its cores with a
small exact program that keeps every family of the model and makes the
finer levels (SMT siblings, shared L2) as good as they can be.

Examples
--------
>>> from tuna_lab import Topology, TunaModel
>>> from tuna_lab.model.encodings import ultrametric_chain
>>> model = TunaModel(64, 6, Topology.preset("epyc-9654-2s"), mode="compact")
>>> chain = ultrametric_chain(model.instance.topology)
>>> solution = fragment_program(model.caps, chain, 2, inner=False).solve()
>>> round(solution.bound)             # the L3 level's part: 64 workers of 6 on 24 L3s of 16
140400
>>> positions = fragment_mapping(model.caps, chain, solution)
>>> positions.shape
(64, 6)

The package, in the order a solve uses it:

- :mod:`~.partitions`: partitions counted and listed, as count vectors;
- :mod:`~.program`: the program, its relaxation, its integer plans and the worker rules;
- :mod:`~.inner`: the finer levels' bound each column of the joint program carries;
- :mod:`~.pricing` and :mod:`~.branching`: column generation and price-and-branch, for programs too
  big to write out;
- :mod:`~.build`: :func:`.fragment_program`, which of the two a level gets;
- :mod:`~.mapping`: :func:`.fragment_mapping`, from a plan to positions;
- :mod:`~.tuning`: every tuning constant, with its reason.
"""

from .build import fragment_program
from .mapping import fragment_mapping
from .program import FragmentProgram, FragmentSolution
from .tuning import MAX_COLUMNS

__all__ = ["MAX_COLUMNS", "FragmentProgram", "FragmentSolution", "fragment_program", "fragment_mapping"]
