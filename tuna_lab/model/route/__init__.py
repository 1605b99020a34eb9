"""The fast route to an optimal mapping, tried before HiGHS: construct, polish, prove by a bound.

:class:`~tuna_lab.model.route.search.Search` is the one object the solve
pipeline (:mod:`tuna_lab.model.pipeline`) talks to: ``construct()`` a
mapping (:mod:`~tuna_lab.model.route.construct`'s greedy placement, and in
compact mode :mod:`~tuna_lab.model.route.fragments`' column generation and
price-and-branch), ``improve`` it by local search, and ask for a
``certificate()``, the combinatorial bound of
:mod:`~tuna_lab.model.route.bounds` that proves it optimal when it closes.
The route reads only the families' :class:`~tuna_lab.model.caps.Caps`: a
family that declares its caps keeps the route without touching it, and a
model with a family it does not know goes straight to HiGHS.
"""
