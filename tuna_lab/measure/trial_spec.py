"""How every trial of a measurement is held, beyond its load: one :class:`TrialSpec`.

The seed, the warm-up, the share of failed requests a valid trial may have
and the load generator's CPUs travel together from the options (``--seed``,
``--warmup``, ``--max-error-rate``, ``--client-cpus``) to every trial; a
program builds the same spec by hand.

Examples
--------
>>> TrialSpec(seed=3).warmup, TrialSpec().max_error_rate
(20, 0.01)
"""

from dataclasses import dataclass

__all__ = ["TrialSpec"]


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
    """

    seed: int = 0
    warmup: int = 20
    max_error_rate: float = 0.01
    client_cpus: object = None
