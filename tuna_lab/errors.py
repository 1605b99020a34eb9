"""Exceptions raised by tuna_lab.

Every error a user can cause derives from :class:`TunaError`, so a caller
(the CLI, a widget) can catch one type and show one clear line.
"""

__all__ = [
    "TunaError",
    "TopologyError",
    "ModelError",
    "PolicyError",
    "InfeasibleModelError",
    "NoSolutionError",
    "ServerError",
    "AnalysisError",
    "LoadError",
    "NumaError",
    "CpuAccountingError",
    "BindingError",
    "ExperimentError",
    "StoreError",
    "UnreadableCellsError",
    "AdviseError",
    "PlanError",
    "PinError",
    "TargetError",
    "TuneError",
    "UnsafeFileError",
    "UnmeetableTargetError",
    "TopologyWarning",
    "RelaxedMappingWarning",
    "ThrottlingWarning",
]


class TunaError(Exception):
    """Base class of every error tuna_lab raises on bad input or an unsolvable request."""


class TopologyError(TunaError, ValueError):
    """A topology could not be built: unknown preset, malformed synthetic spec or hwloc XML."""


class ModelError(TunaError, ValueError):
    """A model was asked for with invalid parameters (workers, threads, mode, families)."""


class PolicyError(ModelError):
    """A placement policy is unknown, malformed, or registered twice under one name."""


class InfeasibleModelError(TunaError):
    """The chosen constraint families admit no mapping.

    Attributes
    ----------
    families : tuple of str
        Keys of a minimal conflicting subset of the model's families
        (:func:`tuna_lab.model.explain.explain`): with (1) and :attr:`needs`
        they admit no mapping, and without any one of them the rest admit
        one. Where no subset was searched for, every active family.
    needs : tuple of str
        Families the conflicting ones read (e.g. (8) and (9-10) for (11-12)).
    reason : str
        Why they conflict, in words (empty where unknown).
    """

    def __init__(self, message, families=(), needs=(), reason=""):
        super().__init__(message)
        self.families = tuple(families)
        self.needs = tuple(needs)
        self.reason = reason


class NoSolutionError(TunaError):
    """The solver stopped (time limit) before it found any feasible mapping."""


class ServerError(TunaError):
    """The inference server's models or app were asked for something invalid or failed to build."""


class AnalysisError(TunaError, ValueError):
    """Experiment tables could not be analysed: missing columns, empty tables, unknown policies."""


class LoadError(TunaError):
    """A load trial was asked for with invalid parameters (rate, counts, a non-loopback URL)."""


class NumaError(TunaError):
    """NUMA information about a process could not be read or parsed.

    The process is gone, ``/proc/<pid>/numa_maps`` is missing (a kernel
    without NUMA support) or not readable (another user's process), or the
    text given as numa_maps is not.

    Attributes
    ----------
    pid : int or None
        The process asked about (None when parsing text).
    """

    def __init__(self, message, pid=None):
        super().__init__(message)
        self.pid = pid


class CpuAccountingError(TunaError):
    """A thread's CPU time could not be read, or samples could not be accounted."""


class BindingError(TunaError):
    """A thread could not be bound to the CPUs asked for (gone, not permitted, or trimmed)."""


class ExperimentError(TunaError):
    """An experiment could not be run or its results could not be read."""


class StoreError(ExperimentError):
    """Results could not be written: a full disk, no permission, a read-only file system.

    What was written before stays on disk (a cell's finished trials in its
    ``.partial`` folder); the message names the file and the system's reason.
    """


class UnreadableCellsError(ExperimentError):
    """Some cells of a results folder cannot be read (a table missing, empty, a FIFO, of the wrong types).

    A reader names them all rather than leave them out of every average. ``cells``: ``{cell: why}``.
    """

    def __init__(self, message, cells=None):
        super().__init__(message)
        self.cells = dict(cells or {})


class AdviseError(TunaError, ValueError):
    """Results cannot train an advisor (no cfs, too few configurations) or a question is malformed."""


class PlanError(TunaError, ValueError):
    """A placement plan is malformed, or was made for another machine (its fingerprint differs)."""


class PinError(TunaError):
    """A running server cannot be pinned: no such process, no workers, or no permission."""


class TargetError(ExperimentError):
    """A server cannot be measured: a URL that refuses connections, an app that does not start, a bad body file."""


class TuneError(ExperimentError):
    """A tune was asked for with bad input: a latency target or budget that does not parse, a budget too
    small for one trial, candidates that do not fit the machine."""


class UnmeetableTargetError(TuneError):
    """No candidate of a tune met the latency target at any rate it tried.

    Attributes
    ----------
    result : TuneResult
        The evidence: every candidate's measurements (:mod:`tuna_lab.measure.tune.tuner`).
    """

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result


class UnsafeFileError(TunaError, OSError):
    """A file or folder was refused: a FIFO, a device, a link where none may be, too large, too deeply nested
    JSON, or a folder another user may write (:mod:`tuna_lab._files`).

    It is an :class:`OSError` too, so code that already treats an unreadable
    file as absent or failed treats a refused one the same way.
    """


class TopologyWarning(UserWarning):
    """A machine was read, but some of what lstopo would know is missing (no cache information, say).

    The topology is still usable; the warning names what is missing and what
    the model assumes instead, so that a flat distance matrix is never a silent surprise.
    """


class RelaxedMappingWarning(UserWarning):
    """A ``tuna-*`` policy placed the threads by a relaxed mapping: the families admit none.

    One line: the conflicting families and what the mapping exceeds
    (:attr:`Mapping.relaxed <tuna_lab.model.mapping.Mapping.relaxed>`); the
    CLI prints it as ``tuna-lab: note: ...`` on stderr.
    """


class ThrottlingWarning(UserWarning):
    """The CPU quota is below the CPUs the server's threads will run on: latencies will measure throttling.

    A CFS quota (a container's CPU limit) below ``min(W x T, usable CPUs)``
    makes the threads wait for quota at the end of every period, so the p99
    measures CFS throttling, not placement. Raised by
    :func:`tuna_lab.machine.limits.check_throttling`, which a run
    (:func:`tuna_lab.measure.experiment.run`) and a lab server's start call;
    with ``strict=True`` the run raises instead.
    """
