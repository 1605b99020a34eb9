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
>>> # skipped: needs ipywidgets and a notebook to show the view
>>> from tuna_lab.widgets import mode_explorer       # doctest: +SKIP
>>> mode_explorer("xeon-8272cl", workers=4, threads=8)   # doctest: +SKIP
"""

import lazy_loader as _lazy

#: The views, imported from :mod:`tuna_lab.widgets.views` (and ipywidgets with them) on first use.
VIEWS = ("mode_explorer", "distance_view", "constraint_toggles", "policy_comparison", "live_experiment")

# The views stay out of __all__: a star import must not need ipywidgets.
__all__ = ["ModeExplorer", "DistanceView", "ConstraintToggles", "PolicyComparison", "LiveExperiment",
           "core_grid", "topology_from", "TOPOLOGY_CHOICES", "compared_policies", "VIEWS"]

__getattr__, _lazy_dir, _ = _lazy.attach(__name__, submodules=["controllers", "figures", "live", "views"],
                                       submod_attrs={
    "controllers": ["TOPOLOGY_CHOICES", "ConstraintToggles", "DistanceView", "LiveExperiment",
                    "ModeExplorer", "PolicyComparison", "compared_policies", "core_grid", "topology_from"],
    "views": list(VIEWS),
})


def __dir__():
    # The module's own names (VIEWS) beside the ones lazy_loader serves.
    return sorted({*globals(), *_lazy_dir()})
