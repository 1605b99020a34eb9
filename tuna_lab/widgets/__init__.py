"""Interactive widgets: plain controllers under thin ipywidgets views.

The controllers (:mod:`tuna_lab.widgets.controllers`) hold each widget's
state and logic and import no ipywidgets, so they work in tests, scripts and
plain notebooks. The views (:mod:`tuna_lab.widgets.views`) need ipywidgets
and are imported on first use.

Examples
--------
>>> from tuna_lab.widgets import ModeExplorer
>>> ModeExplorer("xeon-8272cl", workers=4, threads=8).mapping.assignment.shape
(4, 8)
>>> from tuna_lab.widgets import mode_explorer       # doctest: +SKIP
>>> mode_explorer("xeon-8272cl", workers=4, threads=8)   # doctest: +SKIP
"""

from .controllers import (COMPARED_POLICIES, TOPOLOGY_CHOICES, ConstraintToggles, DistanceView,
                          LiveExperiment, ModeExplorer, PolicyComparison, core_grid, topology_from)

#: The views, imported from :mod:`tuna_lab.widgets.views` on first use.
VIEWS = ("mode_explorer", "distance_view", "constraint_toggles", "policy_comparison", "live_experiment")

# The views stay out of __all__: a star import must not need ipywidgets.
__all__ = ["ModeExplorer", "DistanceView", "ConstraintToggles", "PolicyComparison", "LiveExperiment",
           "core_grid", "topology_from", "TOPOLOGY_CHOICES", "COMPARED_POLICIES", "VIEWS"]


def __getattr__(name):
    # Views import ipywidgets; load them only when one is asked for.
    if name in VIEWS:
        from . import views

        return getattr(views, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *VIEWS])
