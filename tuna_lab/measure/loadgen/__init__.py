"""The load generator: requests on the wire, a clock, schedules, closed and open loops.

:mod:`~tuna_lab.measure.loadgen.requests` holds what is sent (a :class:`Requests`
recipe, like an httpx ``Client`` holds its configuration),
:mod:`~tuna_lab.measure.loadgen.wire` sends it over raw sockets in one epoll loop,
:mod:`~tuna_lab.measure.loadgen.clock` wakes that loop on time,
:mod:`~tuna_lab.measure.loadgen.schedule` draws an open loop's arrival times,
:mod:`~tuna_lab.measure.loadgen.server_timing` reads a server's own timings from its
answers, :mod:`~tuna_lab.measure.loadgen.trivial` is the endpoint that measures the
generator itself, and :mod:`~tuna_lab.measure.loadgen.load` puts them together as
closed and open loops that return one row per request.
"""

import lazy_loader as _lazy

__all__ = ["Requests", "payload", "closed_loop", "open_loop", "summary"]

__getattr__, __dir__, _ = _lazy.attach(
    __name__, submodules=["wire", "clock", "schedule", "server_timing", "trivial", "requests", "load"],
    submod_attrs={"requests": ["Requests"], "load": ["payload", "closed_loop", "open_loop", "summary"]})
