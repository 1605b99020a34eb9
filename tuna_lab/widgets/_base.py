"""What every controller shares: change notification and the refuse-and-keep-state rule."""

from .._checks import one_line, positive_number
from ..errors import ModelError, TunaError

__all__ = ["Controller", "SizedController", "TimedController", "checked_time_limit"]

# What a user can get wrong; anything else is a bug and should be seen as one.
BAD_INPUT = (TunaError, ValueError, OSError)


class Controller:
    """Change notification and the refuse-and-keep-state rule shared by the controllers.

    The members follow one rule: the *inputs* (``workers``, ``mode`` ...) are
    attributes that assigning sets through their ``set_*`` method - it takes
    effect, or raises the error that method refused it with (the method
    itself returns False and sets ``.error``); what the controller computes
    from them is an attribute nobody but the controller assigns
    (``mapping``, ``distance`` ...), and anything worked out on request is a
    method (``grid()``, ``table()``, ``violated()`` ...). Assigning a name the
    controller does not have (``dv.cpus = ...``) is refused, not stored unread.
    ``error`` is an output of every controller: the controller says why it
    refused the last change, and an assigned ``ex.error = None`` would hide that.
    """

    #: input name -> the method that sets it (assigning the attribute calls it)
    _inputs = {}
    #: state the controller computes (or is built with): assigning it is refused
    _outputs = ()
    #: what to do instead, for a controller without inputs
    _fixed = ""

    def __init__(self):
        object.__setattr__(self, "_sealed", False)
        self.error = None
        self._refused = None
        self._listeners = []

    def _seal(self):
        """From now on, assigning an input goes through its setter and assigning an output is refused."""
        object.__setattr__(self, "_sealed", True)

    def __setattr__(self, name, value):
        # The controller's own code writes its state while it is not sealed or inside _attempt's compute.
        if not self.__dict__.get("_sealed") or self.__dict__.get("_committing"):
            object.__setattr__(self, name, value)
        elif name in self._inputs:
            if not getattr(self, self._inputs[name])(value):
                raise self._refused
        elif name == "error":
            raise AttributeError(f"{type(self).__name__}.error is read-only: it says why the controller refused "
                                 "the last change, and the next accepted change clears it")
        elif name in self._outputs:
            cls = type(self).__name__
            inputs = f"assign one of its inputs ({', '.join(self._inputs)})" if self._inputs else ""
            how = "; ".join(filter(None, (self._fixed, inputs))) or f"build a new {cls}"
            raise AttributeError(f"{cls}.{name} is read-only: {how}")
        elif name.startswith("_") or name in self.__dict__:
            object.__setattr__(self, name, value)
        else:
            # A new public name is a typo or a guess (dv.cpus = [0, 1] for highlighted): kept, it would be
            # silently ignored, which is exactly what a setter must not do.
            cls = type(self).__name__
            inputs = f"its inputs are {', '.join(self._inputs)}" if self._inputs else ""
            how = "; ".join(filter(None, (self._fixed, inputs))) or "it takes no inputs"
            raise AttributeError(f"{cls} has no member {name!r} to assign: {how}")

    def _put(self, **state):
        """Write outputs from the controller's own code outside :meth:`_attempt` (a run's thread, say)."""
        for name, value in state.items():
            object.__setattr__(self, name, value)

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
        object.__setattr__(self, "_committing", True)
        try:
            compute()
        except BAD_INPUT as exc:
            self.error, self._refused = one_line(exc), exc
            ok = False
        else:
            self.error, self._refused = None, None
            ok = True
        finally:
            object.__setattr__(self, "_committing", False)
        self._notify()
        return ok

    def _repr_state(self):
        """``name=value`` parts for :meth:`__repr__`, inputs first."""
        parts = []
        for name in self._inputs:
            if name == "time_limit":
                continue            # how long the solver may take, not what the controller shows
            value = getattr(self, name)
            # A topology by its name: its own repr lists every core.
            parts.append(f"{name}={(value.name if name == 'topology' else value)!r}")
        return parts

    def __repr__(self):
        parts = self._repr_state()
        if self.error:
            parts.append(f"error={self.error!r}")
        return f"{type(self).__name__}({', '.join(parts)})"


def checked_time_limit(value):
    """``value`` as the seconds a controller's solves may take, or :class:`ModelError`.

    Checked when it is given, not at the next solve: ``ex.time_limit = "x"``
    accepted would make the next ``set_workers`` refuse with a message about
    a time limit nobody asked it to change.
    """
    return positive_number("time_limit", value, ModelError)


class TimedController(Controller):
    """A controller whose solves take at most ``time_limit`` seconds each: an input like the others.

    Assigning it re-solves (a mapping that stopped at the old limit may be
    better given more time), through the subclass's :meth:`_change`.
    """

    def set_time_limit(self, seconds):
        """Give every solve at most ``seconds`` (a positive number) and re-solve; False and ``.error`` if refused."""
        return self._change(time_limit=seconds)


class SizedController(TimedController):
    """A controller of W workers x T threads on a machine: the setters, over the subclass's ``_change``."""

    _inputs = {"topology": "set_topology", "workers": "set_workers", "threads": "set_threads"}

    def set_workers(self, workers):
        """Run ``workers`` server workers; False and ``.error`` if refused."""
        return self._change(workers=workers)

    def set_threads(self, threads):
        """Give each worker ``threads`` OpenMP threads; False and ``.error`` if refused."""
        return self._change(threads=threads)

    def set_topology(self, spec):
        """Use another machine (see :func:`topology_from`); False and ``.error`` if refused."""
        return self._change(topology=spec)
