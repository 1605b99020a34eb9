"""Placement: where each thread of each server worker may run, and binding threads to it.

A policy (:data:`POLICIES`) turns ``(W, T, topology)`` into a :class:`Placement`
(:func:`placement`, :func:`compare`); :mod:`tuna_lab.placement.binding` binds a
thread by its TID and reads back what the kernel kept; a :class:`Plan`
(``placement(...).plan()``) is a placement you can export and apply to a
server tuna_lab did not start. Only the ``tuna-*``
policies load the solver, and only when asked for.
"""

import lazy_loader as _lazy

__all__ = ["POLICIES", "Placement", "placement", "compare", "Plan"]

__getattr__, __dir__, _ = _lazy.attach(__name__, submodules=["binding"], submod_attrs={
    "policies": ["POLICIES", "Placement", "placement", "compare"],
    "plan": ["Plan"],
})
