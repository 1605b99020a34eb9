"""The built-in policies' names, readable without loading the policies (numpy, the model).

Every ``tuna-lab`` command lists them in its ``--policy`` help; importing
:mod:`tuna_lab.placement.policies` for that would cost each start a tenth of
a second. :mod:`~tuna_lab.placement.policies` registers the policies of
these names, in this order (tests/test_policies.py holds the two together);
a policy registered at run time is known to the library, and the CLI checks
a name against the registry when it uses it.

The export formats of a plan (:meth:`tuna_lab.placement.plan.Plan.render`)
are here too, for the same reason: ``tuna-lab plan --format`` offers this one
table, and :mod:`~tuna_lab.placement.plan` renders it.

Examples
--------
>>> BUILTIN_POLICIES[:2]
('cfs', 'round-robin')
>>> FORMATS[0]
'json'
"""

__all__ = ["BUILTIN_POLICIES", "FORMATS"]

#: The baselines first, then Tuna's two modes.
BUILTIN_POLICIES = ("cfs", "round-robin", "omp-spread", "omp-close", "numa", "tuna-scatter", "tuna-compact")

#: What :meth:`Plan.render <tuna_lab.placement.plan.Plan.render>` can write, the default first.
FORMATS = ("json", "omp-places", "env", "onnxruntime", "taskset", "gunicorn")
