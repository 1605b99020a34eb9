"""The built-in policies' names, readable without loading the policies (numpy, the model).

Every ``tuna-lab`` command lists them in its ``--policy`` help; importing
:mod:`tuna_lab.placement.policies` for that would cost each start a tenth of
a second. :mod:`~tuna_lab.placement.policies` registers the policies of
these names, in this order (tests/test_policies.py holds the two together);
a policy registered at run time is known to the library, and the CLI checks
a name against the registry when it uses it.

Examples
--------
>>> BUILTIN_POLICIES[:2]
('cfs', 'round-robin')
"""

__all__ = ["BUILTIN_POLICIES"]

#: The baselines first, then Tuna's two modes.
BUILTIN_POLICIES = ("cfs", "round-robin", "omp-spread", "omp-close", "numa", "tuna-scatter", "tuna-compact")
