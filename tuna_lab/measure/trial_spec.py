"""How every trial of a measurement is held: its load (:class:`LoadSpec`) and the rest (:class:`TrialSpec`).

The seed, the warm-up, the share of failed requests a valid trial may have
and the load generator's CPUs travel together from the options (``--seed``,
``--warmup``, ``--max-error-rate``, ``--client-cpus``) to every trial; the
load (``--requests``, ``--concurrency``, ``--rate``, ``--duration``) travels
beside them. A program builds the same specs by hand; each is checked once,
when it is made, so a bad one is refused before anything runs.

Examples
--------
>>> TrialSpec(seed=3).warmup, TrialSpec().max_error_rate
(20, 0.01)
>>> LoadSpec().requests, LoadSpec(None, rate=50, duration=10).mode
(1000, 'open')
"""

from dataclasses import dataclass

from .._checks import non_negative_int, positive_int, positive_number
from ..errors import ExperimentError

__all__ = ["TrialSpec", "LoadSpec", "specs_of"]


@dataclass(frozen=True)
class TrialSpec:
    """The settings each trial is held under: its seed, warm-up, failures allowed and the generator's CPUs.

    Parameters
    ----------
    seed : int
        Seeds the policy orders, payload and arrivals.
    warmup : int
        Requests discarded after each start or placement.
    max_error_rate : float
        A trial with a larger share of failed requests (non-2xx, timeouts) is marked failed.
    client_cpus : str, iterable of int or ClientCpus, optional
        CPUs kept for the load generator: a cpulist, ``"none"``, or None for the default
        (:func:`~tuna_lab.machine.reserve.reserve_client_cpus`).

    Raises
    ------
    ExperimentError
        A negative or non-integer seed or warm-up, a ``max_error_rate`` outside [0, 1).

    Examples
    --------
    >>> TrialSpec(seed=-1)
    Traceback (most recent call last):
    ...
    tuna_lab.errors.ExperimentError: seed must be a non-negative integer, got -1
    """

    seed: int = 0
    warmup: int = 20
    max_error_rate: float = 0.01
    client_cpus: object = None

    def __post_init__(self):
        object.__setattr__(self, "seed", non_negative_int("seed", self.seed, ExperimentError))
        object.__setattr__(self, "warmup", non_negative_int("warmup", self.warmup, ExperimentError))
        # Kept as given (a manifest records it, and a resume compares it): only checked.
        try:
            share = float(self.max_error_rate)
        except (TypeError, ValueError):
            share = None
        if isinstance(self.max_error_rate, bool) or share is None or not 0 <= share < 1:
            raise ExperimentError(f"max_error_rate must be in [0, 1), got {self.max_error_rate!r}")


@dataclass(frozen=True)
class LoadSpec:
    """The load each trial sends: a closed loop of ``requests``, or an open loop at ``rate`` for ``duration``.

    Parameters
    ----------
    requests : int or None
        Closed loop: requests per trial. Open loop: at most this many (None: as many as arrive).
    concurrency : int, optional
        Closed loop: requests in flight (None: all of them at once).
    rate, duration : float, optional
        Open loop: mean arrivals per second (Poisson), for ``duration`` seconds; both or neither.

    Raises
    ------
    ExperimentError
        A count that is not a positive integer, a rate or duration that is not a positive finite number.

    Examples
    --------
    >>> LoadSpec(requests=200, concurrency=8)
    LoadSpec(requests=200, concurrency=8, rate=None, duration=None)
    >>> LoadSpec(rate=100)
    Traceback (most recent call last):
    ...
    tuna_lab.errors.ExperimentError: duration must be a positive finite number, got None
    """

    requests: int | None = 1000
    concurrency: int | None = None
    rate: float | None = None
    duration: float | None = None

    def __post_init__(self):
        # The open loop may leave its requests open; the closed loop needs them.
        if self.rate is None or self.requests is not None:
            object.__setattr__(self, "requests", positive_int("requests", self.requests, ExperimentError))
        if self.concurrency is not None:
            positive_int("concurrency", self.concurrency, ExperimentError)
        if self.rate is not None or self.duration is not None:
            positive_number("rate", self.rate, ExperimentError)
            positive_number("duration", self.duration, ExperimentError)

    @property
    def mode(self):
        """``"open"`` (a rate) or ``"closed"``: the manifest's ``load_mode``."""
        return "open" if self.rate is not None else "closed"


def specs_of(requests, options):
    """``(LoadSpec, TrialSpec, rest)``: a sweep's flat ``requests`` and ``**run_options`` as :func:`run` takes them.

    ``options`` holds the keywords ``sweep`` passes on (``concurrency``,
    ``rate``, ``duration``, ``seed``, ``warmup``, ``max_error_rate``,
    ``client_cpus``, and others such as ``csv``); ``rest`` is what is left
    for :func:`~tuna_lab.measure.experiment.run` itself. A dict of plain values
    travels to a cluster's worker, which makes the specs there.

    Examples
    --------
    >>> load, trial, rest = specs_of(200, {"seed": 3, "concurrency": 4, "csv": True})
    >>> load.concurrency, trial.seed, rest
    (4, 3, {'csv': True})
    """
    options = dict(options)
    load = LoadSpec(requests, *(options.pop(k, None) for k in ("concurrency", "rate", "duration")))
    trial = TrialSpec(**{f: options.pop(f) for f in ("seed", "warmup", "max_error_rate", "client_cpus")
                         if f in options})
    return load, trial, options
