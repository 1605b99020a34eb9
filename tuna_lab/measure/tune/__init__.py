"""Sizing to a latency target: race W x T candidates at rising load and keep the cheapest that holds it.

:mod:`~tuna_lab.measure.tune.race` is the search (successive halving with a
racing rule), independent of how a step is measured;
:mod:`~tuna_lab.measure.tune.tuner` measures each step on a real, drained server.
"""

import lazy_loader as _lazy

__all__ = ["tune", "read_tune", "auto_configs"]

__getattr__, __dir__, _ = _lazy.attach(
    __name__, submodules=["race", "tuner"],
    submod_attrs={"tuner": ["tune", "read_tune", "auto_configs"]})
