"""Placement: where each thread of each server worker may run, and binding threads to it.

A policy (a registered :class:`Policy`; :func:`registered_policies` lists them,
:func:`register` adds one) turns ``(W, T, topology)`` into a
:class:`Placement` (:func:`placement`, :func:`compare`); a :class:`Plan`
(``placement(...).plan()``) is a placement you can export and apply to a
server tuna_lab did not start (:mod:`tuna_lab.live` binds a running
server's threads to it). Nothing here reads /proc. Only the policies that
need the solver load it, and only when asked for.
"""

import lazy_loader as _lazy

__all__ = ["POLICIES", "Policy", "register", "unregister", "registered_policies", "policy_names", "get_policy",
           "Placement", "placement", "compare", "Plan", "PinnedBy"]

__getattr__, __dir__, _ = _lazy.attach(__name__, submod_attrs={
    "policies": ["POLICIES", "Policy", "register", "unregister", "registered_policies", "policy_names", "get_policy",
                 "Placement", "placement", "compare"],
    "plan": ["Plan", "PinnedBy"],
})
