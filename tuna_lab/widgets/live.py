"""The live pin-and-measure experiment as a controller: a background run, results as they arrive."""

import atexit
import threading
import weakref

import pandas as pd

from .._checks import one_line
from ..errors import TunaError
from ._base import Controller

__all__ = ["LiveExperiment"]

_RESULT_COLUMNS = ["trial", "order", "policy", "p50", "p99", "trial_status", "reason"]
_RUNNING = weakref.WeakSet()


class _StopRequested(KeyboardInterrupt):
    """Raised from the trial callback to end a run between trials.

    A KeyboardInterrupt so that ``experiment.run`` treats it as Ctrl-C: it
    keeps the finished trials next to ``out`` (``.partial``) and re-raises.
    """


@atexit.register
def _stop_all():
    # The runner thread is a daemon: without this an exiting kernel could kill
    # it mid-trial and leave a Gunicorn server (in its own session) behind.
    for live in list(_RUNNING):
        live.stop(wait=True, timeout=120)


class LiveExperiment(Controller):
    """The pin-and-measure experiment run in a background thread, with results as they arrive.

    Parameters
    ----------
    workers, threads : int
        The lab server's W and T (ignored with ``target``, which has its own).
    model : {"small", "medium", "large"}
    batch : int
    policies : sequence of str
    trials, requests : int
        Passed to :func:`tuna_lab.measure.experiment.run`.
    out : str, optional
        Directory to write the cell into (nothing is written by default).
    seed : int
    target : Target, optional
        What to measure instead of the lab server: a user's app that tuna_lab
        starts (:class:`~tuna_lab.measure.target.AppTarget`) or a server
        already running (:class:`~tuna_lab.measure.attached.AttachedTarget`,
        given back its masks when the run ends or is stopped).

    Attributes
    ----------
    state : {"idle", "running", "stopping", "stopped", "finished", "failed"}
    lines : list of str
        Progress lines so far.
    result : Result or None
        The experiment's result, once finished.
    error : str or None
        Why the run failed or a start was refused.

    These, like the settings, are read-only: :meth:`start` and :meth:`stop`
    change them (``live.state = "running"`` would start nothing).

    Notes
    -----
    Subscribed callbacks run in the runner thread. :meth:`stop` takes effect
    between trials: the trial in flight finishes and its server is stopped
    by the experiment's own context manager, so no server is left behind.

    Examples
    --------
    >>> live = LiveExperiment(1, 1, policies=["cfs"], trials=1, requests=20)
    >>> # skipped: starts lab servers and measures them (tests/test_experiment.py does)
    >>> live.start(); live.wait()                                   # doctest: +SKIP
    >>> live.results()[["policy", "trial", "p99"]]                  # doctest: +SKIP
    >>> # skipped: needs a server running as PID 1234
    >>> from tuna_lab.measure.attached import AttachedTarget         # doctest: +SKIP
    >>> live = LiveExperiment(None, None, policies=["cfs", "tuna-scatter"],
    ...                       target=AttachedTarget(1234, "http://127.0.0.1:8000/", 2))  # doctest: +SKIP
    """

    def __init__(self, workers, threads, model="small", batch=100,
                 policies=("cfs", "round-robin", "tuna-scatter"), trials=3, requests=100, *, out=None, seed=0,
                 target=None):
        from ..measure.experiment import Config, ExperimentError
        from ..model.instance import check_positive_int
        from ..placement.policies import policy_names

        super().__init__()
        self.target = target
        # A target's cell is its own (W, T and label), as run() names it.
        self.config = None if target is not None else Config(workers, threads, model, batch)
        self.policies = list(dict.fromkeys([policies] if isinstance(policies, str) else policies))
        unknown = [p for p in self.policies if p not in policy_names()]
        if unknown or not self.policies:
            raise ExperimentError(f"unknown policy {unknown[0]!r}" if unknown else "no policies given")
        self.trials = check_positive_int("trials", trials)
        self.requests = check_positive_int("requests", requests)
        self.out, self.seed = out, seed
        self.state, self.lines, self.result = "idle", [], None
        self._rows, self._lock, self._between = [], threading.Lock(), False
        self._stop, self._thread = threading.Event(), None
        self._seal()

    def _repr_state(self):
        c = self.config
        cell = "a target" if c is None else f"W={c.workers} x T={c.threads}, model {c.model!r}, batch {c.batch}"
        return [cell, f"policies={self.policies}", f"trials={self.trials}", f"requests={self.requests}",
                f"state={self.state!r}", f"finished_trials={len(self._rows)}"]

    # The settings are fixed for the controller's life: a different run is a new LiveExperiment. The run's
    # progress is the runner's to write: an assigned state would say "running" with nothing running.
    _outputs = ("target", "config", "policies", "trials", "requests", "out", "seed", "state", "lines", "result")
    _fixed = "start() and stop() run it; another run is a new LiveExperiment(...)"

    def running(self):
        """Whether a run is in progress (its thread alive)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self):
        """Start the run in a background thread; False (and ``.error``) if one is running."""
        if self.running():
            self._put(error="an experiment is already running")
            self._notify()
            return False
        self._stop.clear()
        with self._lock:
            self._put(lines=[], _rows=[], result=None)
        self._put(state="running", error=None)
        self._thread = threading.Thread(target=self._run, name="tuna-lab-live-experiment", daemon=True)
        _RUNNING.add(self)
        self._thread.start()
        self._notify()
        return True

    def stop(self, wait=True, timeout=None):
        """Ask the run to stop after the trial in flight; with ``wait``, block until it has.

        Returns True when no run is left running.
        """
        if self.running():
            self._stop.set()
            if self.state == "running":
                self._put(state="stopping")
                self._notify()
            if wait:
                self._thread.join(timeout)
        return not self.running()

    def wait(self, timeout=None):
        """Block until the run ends; Ctrl-C stops it cleanly (after the trial in flight) and re-raises."""
        if self._thread is None:
            return True
        try:
            self._thread.join(timeout)
        except KeyboardInterrupt:
            self.stop(wait=True)
            raise
        return not self.running()

    def results(self):
        """Trials finished so far: ``trial``, ``order``, ``policy``, ``p50``, ``p99`` (seconds),
        ``trial_status``, ``reason``."""
        with self._lock:
            return pd.DataFrame(self._rows, columns=_RESULT_COLUMNS)

    def summary(self):
        """The finished run's :class:`~tuna_lab.analysis.summary.RunSummary` (the tables ``tuna-lab run`` prints);
        None until the run has finished."""
        from ..analysis.summary import summarize

        return None if self.result is None else summarize(self.result)

    def figure(self):
        """Each finished trial's p99 (plotly), one marker trace per policy."""
        from . import figures

        return figures.p99_figure(self.results())

    def _trial(self, result):
        """One (trial, policy) finished: its rows (``run`` then prints its line through :meth:`_progress`)."""
        rows = result.trials.reindex(columns=_RESULT_COLUMNS).to_dict("records")
        with self._lock:
            self._rows.extend(rows)
            self._between = True

    def _progress(self, line):
        with self._lock:
            self.lines.append(line)
            between, self._between = self._between, False
            done = len(self._rows)
        self._notify()
        # A stop asked for takes effect after a trial's line; after the very last one it would
        # only throw the finished result away.
        if between and self._stop.is_set() and done < self.trials * len(self.policies):
            raise _StopRequested

    def _run(self):
        from ..measure.experiment import run
        from ..measure.trial_spec import LoadSpec, TrialSpec

        try:
            result = run(self.config, self.policies, trials=self.trials, load=LoadSpec(requests=self.requests),
                         trial=TrialSpec(seed=self.seed), out=self.out, progress=self._progress,
                         on_trial=self._trial, target=self.target)
        except _StopRequested:
            state, error = "stopped", None
            with self._lock:
                self.lines.append(f"stopped after {len(self._rows)} of {self.trials * len(self.policies)} trials")
        except TunaError as exc:
            state, error = "failed", one_line(exc)
        except Exception as exc:  # noqa: BLE001 - nobody above this thread would see it otherwise
            state, error = "failed", f"{type(exc).__name__}: {one_line(exc)}"
        else:
            state, error = "finished", None
            with self._lock:
                self._put(result=result, _rows=result.trials[_RESULT_COLUMNS].to_dict("records"))
        finally:
            _RUNNING.discard(self)
        self._put(state=state, error=error)
        self._notify()
