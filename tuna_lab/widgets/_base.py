"""What every controller shares: change notification and the refuse-and-keep-state rule."""

from .._checks import one_line
from ..errors import TunaError

__all__ = ["Controller", "SizedController"]

# What a user can get wrong; anything else is a bug and should be seen as one.
BAD_INPUT = (TunaError, ValueError, OSError)


class Controller:
    """Change notification and the refuse-and-keep-state rule shared by the controllers."""

    def __init__(self):
        self.error = None
        self._listeners = []

    def subscribe(self, callback):
        """Call ``callback(controller)`` after every change, accepted or refused; returns ``callback``."""
        self._listeners.append(callback)
        return callback

    def unsubscribe(self, callback):
        """Stop calling ``callback``."""
        self._listeners = [cb for cb in self._listeners if cb is not callback]

    def _notify(self):
        for callback in list(self._listeners):
            callback(self)

    def _attempt(self, compute):
        """Run ``compute`` (which commits state only at its very end); True if it succeeded."""
        try:
            compute()
        except BAD_INPUT as exc:
            self.error = one_line(exc)
            ok = False
        else:
            self.error = None
            ok = True
        self._notify()
        return ok


class SizedController(Controller):
    """A controller of W workers x T threads on a machine: the setters, over the subclass's ``_change``."""

    def set_workers(self, workers):
        """Run ``workers`` server workers; False and ``.error`` if refused."""
        return self._change(workers=workers)

    def set_threads(self, threads):
        """Give each worker ``threads`` OpenMP threads; False and ``.error`` if refused."""
        return self._change(threads=threads)

    def set_topology(self, spec):
        """Use another machine (see :func:`topology_from`); False and ``.error`` if refused."""
        return self._change(topology=spec)
