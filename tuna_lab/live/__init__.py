"""Live: everything that touches a running server.

:mod:`~tuna_lab.live.roles` tells a master's workers from its front ends and
helpers; :mod:`~tuna_lab.live.pools` finds the threads that do the work
(by the runtimes of :mod:`~tuna_lab.live.runtimes` and by what they do under
:mod:`~tuna_lab.live.traffic`'s requests); :mod:`~tuna_lab.live.binding` is
the one binder; :mod:`~tuna_lab.live.pin` pins, unpins and watches a server,
:mod:`~tuna_lab.live.audit` looks at the machine around it and isolates it;
:mod:`~tuna_lab.live.ledger` records every mask we set and the one it
replaced; :mod:`~tuna_lab.live.state` holds the Gunicorn hooks' state folder.
The offline plan these act on is :mod:`tuna_lab.placement`'s. Submodules load
on first use: a Gunicorn master imports only what its hooks need.
"""

import lazy_loader as _lazy

__all__ = []     # a package of rooms: import the one you need (tuna_lab.live.pin, ...)
__getattr__, __dir__, _ = _lazy.attach(__name__, submodules=["audit", "binding", "ledger", "pin", "pools", "roles",
                                                             "runtimes", "state", "traffic"])
