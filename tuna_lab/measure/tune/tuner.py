"""Sizing to a latency target: race workers x threads x policy candidates on open-loop rate.

:func:`tune` answers "how many workers, how many threads each, and which
placement, for my p99 target?". A *candidate* is a W x T pair, a placement
policy and an OpenMP wait policy; its figure of merit is the highest
Poisson (open-loop) rate at which the p99 of the client's latency - from each
request's scheduled send time, so queueing counts - stays within the target
(the "throughput with bounded latency"). The search, successive
halving with a racing rule, is :func:`~tuna_lab.measure.tune.race.race`
(:mod:`tuna_lab.measure.tune.race` says how it rounds, bounds, drops and budgets);
this module runs it on servers.

Every step is a trial in the records, in the schema of ``run`` and ``sweep``
(:mod:`tuna_lab.measure.schema`; one cell folder per W x T x wait policy,
each step a trial with its ``rate``, ``round`` and ``step``), so ``tuna-lab
report`` and ``advise`` read a tune as they read a sweep. Each step is on disk as soon as it is
measured (:mod:`tuna_lab.measure.tune.records`): an interrupt keeps every step before it, and a tune
given the same ``out`` and settings resumes from them.

Examples
--------
>>> from tuna_lab.measure.tune.tuner import parse_duration, auto_configs
>>> parse_duration("50ms"), parse_duration("90s"), parse_duration("15m")
(0.05, 90.0, 900.0)
>>> auto_configs(2)
[(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)]
>>> # skipped: starts lab servers and races them for minutes
>>> result = tune(0.05, model="medium", batch=100, budget="5m", out="results/tune")   # doctest: +SKIP
>>> result.table[["candidate", "rate", "rate_low", "rate_high", "reason"]]             # doctest: +SKIP
"""

import os
from dataclasses import fields

from ..._checks import positive_int, spec_or_default
from ...errors import ExperimentError, TuneError, UnmeetableTargetError
from ..trial_spec import TrialSpec
from .race import (START_GUESS, Candidate, RaceRules, Step, TuneResult, auto_configs, check_step_seconds,
                   format_seconds, parse_duration, race, rate_bounds)
from .records import step_of

# The search's names are this module's too: `from tuna_lab.measure.tune.tuner import race` stays.
__all__ = ["Candidate", "Step", "TuneResult", "RaceRules", "parse_duration", "auto_configs", "rate_bounds", "race",
           "tune", "read_tune", "TUNE_FILE"]

#: The race itself (the table, the winner and every round), written beside the records: what `read_tune` reads.
TUNE_FILE = "tune.json"

# What tune() took as keywords before TrialSpec and Candidate configs carried them: refused at once, in one line.
_MOVED = {"seed": "trial=TrialSpec(seed=...)", "warmup": "trial=TrialSpec(warmup=...)",
          "max_error_rate": "trial=TrialSpec(max_error_rate=...)", "client_cpus": "trial=TrialSpec(client_cpus=...)",
          "candidates": "configs=[Candidate(...), ...]"}
# The keywords of race() that tune() passes on (beside RaceRules' fields).
_RACE_KEYWORDS = ("exhaustive", "clock")


def tune(sla_p99, *, configs="auto", policies=("cfs", "round-robin", "tuna-scatter"), wait_policies=("default",),
         model="medium", batch=100, target=None, budget="15m", out=None, trial=None, progress=None, **race_options):
    """Find the workers x threads x policy serving the most requests per second within a p99 target.

    Parameters
    ----------
    sla_p99 : float or str
        The p99 target of the client's latency: seconds, or ``"50ms"``.
    configs : "auto", list of (int, int) or list of Candidate
        The W x T pairs (``"auto"``: :func:`auto_configs`); unused for a running server. A list of
        :class:`Candidate` races exactly those (their policies and wait policies too; not for a running server).
    policies, wait_policies : sequence of str
        Placement policies and OpenMP wait policies; every pair x policy x wait policy is a candidate.
    model, batch, target : str, int, AppTarget or AttachedTarget
        The lab server's model and rows per request; or a user's app, or a running server (optional).
    budget : float or str
        Wall time of the whole search (``"15m"``); honoured to within 10%.
    out : str, optional
        Folder for the records, one cell folder per W x T x wait policy, each step written as it is
        measured; a folder holding this tune's steps (same settings) is resumed from them.
    trial : TrialSpec, optional
        Seed, warm-up, failures allowed and the load generator's CPUs
        (:class:`~tuna_lab.measure.trial_spec.TrialSpec`; default ``TrialSpec()``).
    progress : callable, optional
        Called with one line per run.
    **race_options
        ``rounds``, ``step_seconds``, ``steps``, ``eta``, ``tolerance``, ... (the fields of
        :class:`~tuna_lab.measure.tune.race.RaceRules`), ``exhaustive``: see :func:`.race`.

    Returns
    -------
    TuneResult

    Raises
    ------
    TuneError
        A target or budget that does not parse or is too small, a bad policy or wait policy, a step
        shorter than :data:`~tuna_lab.measure.tune.race.MIN_STEP_SECONDS`; an ``out`` that holds a
        sweep, another command's cells or a tune with other settings (:mod:`tuna_lab.measure.claims`).
    UnmeetableTargetError
        No candidate met the target at any rate tried (``.result`` holds the evidence).

    Notes
    -----
    See docs/tune.md, sections "What is searched", "The race" and "From Python".

    Examples
    --------
    >>> # skipped: starts lab servers and races them for minutes
    >>> result = tune("100ms", configs=[(1, 1), (2, 1)], model="small", batch=10, budget="2m")  # doctest: +SKIP
    >>> result.winner.name, result.plan.splitlines()[0]                                        # doctest: +SKIP
    """
    from ...machine.limits import Limits
    from ...machine.reserve import reserve_client_cpus
    from ..experiment import Config, check_policies
    from ..attached import AttachedTarget

    moved = sorted(set(race_options) & set(_MOVED))
    if moved:
        raise TuneError(f"tune() takes {moved[0]} as {_MOVED[moved[0]]}")
    rules = {f.name for f in fields(RaceRules)}
    unknown = sorted(set(race_options) - rules - set(_RACE_KEYWORDS))
    if unknown:
        raise TuneError(f"tune() has no option {unknown[0]!r} (the race's are {', '.join(sorted(rules))}, "
                        f"{', '.join(_RACE_KEYWORDS)})")
    trial = spec_or_default("trial", trial, TrialSpec, TuneError)
    seed, warmup, max_error_rate, client_cpus = trial.seed, trial.warmup, trial.max_error_rate, trial.client_cpus
    sla = parse_duration(sla_p99, "the p99 target")
    budget = parse_duration(budget, "the budget")
    candidates = None
    if not isinstance(configs, str):
        configs = list(configs)
        if any(isinstance(c, Candidate) for c in configs):
            if not all(isinstance(c, Candidate) for c in configs):
                raise TuneError("configs must be W x T pairs or Candidates, not both")
            candidates = configs
    if candidates is not None:
        candidates = list(dict.fromkeys(candidates))
        if isinstance(target, AttachedTarget):
            raise TuneError("a running server keeps its workers and threads: give it policies, not candidates")
        policies = list(dict.fromkeys(c.policy for c in candidates))
        wait_policies = [c.wait_policy for c in candidates]
        configs = [(c.workers, c.threads) for c in candidates]
    try:
        policies = check_policies(list(policies))
        waits = list(dict.fromkeys(wait_policies))
        for wait in waits:
            Config(1, 1, wait_policy=wait)
    except ExperimentError as exc:
        raise TuneError(str(exc)) from None
    attached = isinstance(target, AttachedTarget)
    note = ""
    machine = None
    if attached:
        if waits != ["default"]:
            raise TuneError("a running server keeps its OpenMP wait policy: leave out --wait-policies")
        target.check()
        pairs = [(target.workers, target.threads)]
        note = (f"a running server keeps its workers and threads ({target.workers}x{target.threads}): "
                f"only the policies were searched")
        from ...machine.topology import Topology

        machine = Topology.from_sysfs(allowed=os.sched_getaffinity(target.master))
    split = reserve_client_cpus(client_cpus, topology=machine, error=TuneError)
    if not attached:
        if isinstance(configs, str):
            if configs != "auto":
                raise TuneError(f"configs must be 'auto' or W x T pairs, got {configs!r}")
            pairs = auto_configs(min(Limits.read().effective_cpus, split.server.n_logical))
        else:
            pairs = [(positive_int("workers", w, TuneError), positive_int("threads", t, TuneError))
                     for w, t in configs]
            if not pairs:
                raise TuneError("no W x T pairs given")
    for _, threads in pairs:
        split.check_threads(threads, TuneError)
    options = {"rounds": 4, "step_seconds": 2.0, **race_options}
    check_step_seconds(options["step_seconds"])
    timeout = 2.0 * sla + 0.5
    smallest = START_GUESS + options["step_seconds"] + timeout
    if budget < smallest:
        raise TuneError(f"a budget of {budget:g} s is too small for one trial: a server start and one "
                        f"{options['step_seconds']:g} s step take about {smallest:.0f} s")
    if candidates is None:
        candidates = [Candidate(w, t, p, wait) for (w, t) in pairs for wait in waits for p in policies]
    lab = _Evaluator(sla, model, batch, target, split, seed, warmup, max_error_rate, timeout)
    import contextlib

    from ..cpulock import lock_cpus

    with contextlib.ExitStack() as held:
        prior = {}
        if out is not None:
            # Held from before the first step to the last write; every step is on disk once measured.
            prior = _open_records(held, lab, out, candidates, _settings(sla, model, batch, target, seed, warmup,
                                                                          max_error_rate), progress)
        if progress:
            progress(f"tune: {len(candidates)} candidates, p99 target {sla * 1e3:g} ms, budget {budget:g} s; "
                     + split.describe())
        # One measurement per CPU of this machine, as for run(): waited for before the budget starts.
        held.enter_context(lock_cpus(set(split.server.cpus) | set(split.cpus), progress))
        try:
            # The search's rules travel as one RaceRules; the rest (exhaustive, clock) as race's own keywords.
            result = race(candidates, lab.evaluate, sla, budget, timeout=timeout, progress=progress, prior=prior,
                          rules=RaceRules(**{k: v for k, v in options.items() if k in rules}),
                          **{k: v for k, v in options.items() if k not in rules})
        finally:
            lab.stop()
        result.note = note
        result.out = lab.write(out, result) if out else None
    if result.winner is None:
        _write_race(result)
        best = min((s for steps in result.steps.values() for s in steps if s.n), key=lambda s: s.p99, default=None)
        seen = f": the best p99 seen was {format_seconds(best.p99)} at {best.rate:g}/s" if best else ""
        raise UnmeetableTargetError(f"no candidate meets a p99 of {sla * 1e3:g} ms at any rate tried{seen}", result)
    win = result.winner
    result.plan = lab.plan(win)
    _write_race(result)
    return result


def _settings(sla, model, batch, target, seed, warmup, max_error_rate):
    """The tune's settings file (``sweep.json``, ``kind`` ``"tune"``): a resume must share them but the budget."""
    from ... import __version__

    kind = "lab" if target is None else f"{getattr(target, 'kind', 'app')}:{getattr(target, 'label', '')}"
    return {"kind": "tune", "sla_p99": float(sla), "model": model if target is None else None,
            "batch": int(batch) if target is None else None, "target": kind, "seed": int(seed),
            "warmup": int(warmup), "max_error_rate": float(max_error_rate), "version": __version__}


def _open_records(held, lab, out, candidates, settings, progress):
    """Check and hold ``out``, write its settings, and read the steps a resume keeps: the race's ``prior``."""
    from ..claims import check_cell_name, check_claim
    from ..store import check_out, lock_folder, write_sweep_file
    from .records import TuneRecords

    check_out(out, "--out")
    try:
        check_claim(out, "tune", settings)
        keys = {}
        for c in candidates:
            config = lab.config_of(c)
            keys[config.key] = config
            check_cell_name(os.path.join(out, config.key))
    except ExperimentError as exc:
        raise TuneError(str(exc)) from None
    held.enter_context(lock_folder(out))
    write_sweep_file(out, settings)
    lab.records = TuneRecords(out, lab.sla)
    lab.out = out
    prior = lab.records.load(keys)
    if progress and prior:
        steps = sum(len(v) for v in prior.values())
        progress(f"tune: resumed {steps} steps of {len(prior)} candidates measured before in {out}")
    return prior


def _write_race(result):
    """``<out>/tune.json``: the race as :meth:`TuneResult.to_dict` gives it, written whole or not at all."""
    if result.out:
        from ..store import write_json

        write_json(os.path.join(result.out, TUNE_FILE), result.to_dict(), allow_nan=False)


def read_tune(out):
    """The :class:`TuneResult` that ``tune(out=...)`` (or ``tuna-lab tune --out``) wrote into ``out``.

    The records (one cell per W x T x wait policy) are read as any sweep's,
    with :func:`~tuna_lab.measure.store.load_results`; this is the race:
    the table, the winner and its plan, and ``history``, every candidate's
    rate interval after every round.

    Raises
    ------
    TuneError
        ``out`` holds no ``tune.json``, or one that does not parse.

    Examples
    --------
    >>> # skipped: the path is relative to the repository root, not to where the doctests run
    >>> result = read_tune("notebooks/data/tune-2cpu")   # doctest: +SKIP
    >>> result.history.groupby("round")["status"].value_counts()   # doctest: +SKIP
    """
    from ..._files import read_json

    path = os.path.join(out, TUNE_FILE)
    try:
        return TuneResult.from_dict(read_json(path, follow=False))
    except FileNotFoundError:
        raise TuneError(f"{out}: no {TUNE_FILE} (not the folder of a tune)") from None
    except OSError as exc:
        raise TuneError(str(exc)) from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TuneError(f"{path}: unreadable ({type(exc).__name__}: {str(exc)[:120]})") from None


class _Evaluator:
    """The real target: a server per candidate run (the lab server, a user's app) or a running one, pinned."""

    def __init__(self, sla, model, batch, target, split, seed, warmup, max_error_rate, timeout):
        self.sla, self.model, self.batch, self.user = sla, model, batch, target
        self.split, self.seed, self.warmup = split, seed, warmup
        self.max_error_rate, self.timeout = max_error_rate, timeout
        self.targets = {}
        self.counts = {}
        # With --out: every measured step is written at once (records.TuneRecords).
        self.records, self.out = None, None

    def config_of(self, candidate):
        """The cell :class:`~tuna_lab.measure.experiment.Config` of a candidate's W x T x wait (nothing started)."""
        from ..experiment import Config
        from ..target import AppTarget

        user = self.user
        if user is None:
            return Config(candidate.workers, candidate.threads, self.model, self.batch,
                          wait_policy=candidate.wait_policy)
        if isinstance(user, AppTarget):
            return Config(candidate.workers, candidate.threads, user.label, 0, wait_policy=candidate.wait_policy,
                          target="app")
        return Config(user.workers, user.threads, user.label, 0, target="attached")

    def _target(self, candidate):
        """The target and cell config of a candidate's W x T x wait, started once."""
        from ...server.openmp import wait_policy_env
        from ..target import AppTarget, LabTarget

        key = (candidate.workers, candidate.threads, candidate.wait_policy)
        if key not in self.targets:
            user = self.user
            config = self.config_of(candidate)
            if user is None:
                target = LabTarget(config, seed=self.seed)
            elif isinstance(user, AppTarget):
                env, _ = wait_policy_env(key[2])
                target = AppTarget(user.app, key[0], key[1], server=user.server, app_dir=user.app_dir,
                                   server_conf=user.server_conf, requests=user.requests, env={**user.env, **env},
                                   label=user.label, python=user.python)
            else:
                target = user
            target.start(self.split.server)
            self.targets[key] = (target, config)
        return self.targets[key]

    def evaluate(self, candidate, rnd, next_step):
        from ..trials import TrialPlan, run_steps

        target, config = self._target(candidate)
        plan = TrialPlan(config, target, (), None, None, self.warmup, self.split.server.n_logical, self.split,
                         seed=self.seed, max_error_rate=self.max_error_rate, timeout=self.timeout)
        counter = (config.key, candidate.policy)
        # After the trials of this policy's cell already on disk (a resume's), never over them.
        first = self.records.next_trial(config, candidate.policy) if self.records else self.counts.get(counter, 0)
        # run_steps asks for each step with the last row; the race decides from a Step: converted in between.
        current = {"step": next_step(None)}
        if current["step"] is None:
            return
        for index, measured in enumerate(run_steps(plan, candidate.policy, lambda row: current["step"], trial=first)):
            rate, duration = current["step"]
            row = measured.row
            row.update(rate=float(rate), step_duration=float(duration), round=rnd + 1, step=index,
                       sla_p99=self.sla, candidate=candidate.name)
            frame = measured.requests
            if len(frame):
                frame = frame.assign(rate=float(rate), round=rnd + 1, step=index)
            self.counts[counter] = first + index + 1
            if self.records is not None:
                # On disk before the race hears of it: an interrupt from here on keeps this step.
                self.records.add(config, row, frame, measured.threads, lambda: self._manifest(config, target))
            current["step"] = next_step(step_of(row, frame, self.sla, rnd))

    def _manifest(self, config, target):
        """A cell's manifest as :func:`~tuna_lab.measure.experiment.manifest` makes it (its counts set per write)."""
        from ..experiment import manifest

        return manifest(config, [], 1, None, self.seed, {
            "warmup": self.warmup, "max_error_rate": self.max_error_rate, "load_mode": "open",
            "rate": None, "duration": None, "wait_policy": config.wait_policy, "spincount": None,
            "client_cpus": self.split.to_dict(), "requests_sent": target.requests.describe(),
            "target": target.describe()}, target=target)

    def stop(self):
        for target, _ in self.targets.values():
            target.stop()

    def plan(self, candidate):
        """The winner's ``plan --format gunicorn``."""
        from ...placement.policies import placement

        try:
            placed = placement(candidate.policy, candidate.workers, candidate.threads, self.split.server)
            return placed.plan().render("gunicorn")
        except Exception as exc:   # a plan is a convenience: its absence must not lose the tune's evidence
            return f"# no plan: {exc}"

    def write(self, out, result):
        """Every cell once more, its manifest saying how the race ended (each step is on disk already)."""
        tune = {"sla_p99": result.sla_p99, "budget": result.budget, "elapsed": result.elapsed,
                "confidence": result.confidence, "winner": result.winner.name if result.winner else None,
                "sure": result.sure}
        for key in list(self.records.cells):
            self.records.write_cell(key, {"tune": tune})
        return out
