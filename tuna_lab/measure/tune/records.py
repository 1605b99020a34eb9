"""A tune's records on disk as it goes: every measured step written at once, and read back by a resume.

A tune measured for minutes and wrote its cells only at the very end, so a
Ctrl-C after 20 s or after 15 minutes lost every measurement. Here each
step, once measured, rewrites its cell (one per W x T x wait policy, in the
schema of ``run`` and ``sweep``) whole and atomically
(:func:`~tuna_lab.measure.store.write_cell`): an interrupt keeps every step
measured before it. The folder's settings file
(:data:`~tuna_lab.measure.store.SWEEP_FILE`, ``kind`` ``"tune"``) is written
before the first step; a tune given the same folder with the same settings
resumes: :meth:`TuneRecords.load` turns the steps on disk back into the
race's :class:`~tuna_lab.measure.tune.race.Step` per candidate, and the race
starts from them (:func:`~tuna_lab.measure.tune.race.race`'s ``prior``).
Another command's folder, or a tune's with other settings, is refused
(:func:`~tuna_lab.measure.claims.check_claim`).

Examples
--------
>>> # skipped: writes a tune's folder (tests/test_hostile_results.py writes one from made-up steps)
>>> records = TuneRecords("results/tune", settings)             # doctest: +SKIP
>>> records.load()                                             # doctest: +SKIP
{'1x1 cfs': [Step(rate=10.0, ...)]}
"""

import math
import os
import time

import numpy as np
import pandas as pd

from ...errors import TuneError
from .. import schema
from .race import Step

__all__ = ["TuneRecords", "step_of"]


def step_of(row, frame, sla, rnd):
    """The race's :class:`Step` of one measured step: its trial ``row`` and its requests ``frame``.

    Requests over the target ``sla`` (seconds) and failed ones count as over.
    The rate is the one the step offered, over the time really measured: a
    step whose load generator sent far fewer requests than its rate asks in
    that time (beyond the Poisson spread) did not offer that rate, and
    counts as missing the target there, never as meeting it.

    Examples
    --------
    >>> row = {"wall_seconds": 0.001, "reason": ""}
    >>> frame = pd.DataFrame({"status": [200], "error": [""], "client_seconds": [0.01]})
    >>> step_of({**row, "rate": 1e5, "step_duration": 4e-9}, frame, 0.05, 0).passed
    False
    """
    rate, duration = float(row["rate"]), float(row["step_duration"])
    seconds = float(row.get("wall_seconds") or duration)
    if not len(frame) or str(row.get("reason", "")).startswith("the server died"):
        return Step(rate, duration, 0, 0, math.nan, round=rnd, seconds=seconds,
                    error=row.get("reason") or "no request was answered")
    status = frame["status"].to_numpy()
    ok = (status >= 200) & (status < 300) & (frame["error"].fillna("").to_numpy() == "")
    latency = np.where(ok, frame["client_seconds"].to_numpy(float), np.inf)
    latency = np.where(np.isnan(latency), np.inf, latency)
    n = int(len(latency))
    over = int((latency > sla).sum())
    p99 = float(np.percentile(latency, 99, method="higher"))
    # The rate over the time really measured: what the step asked for, over the longer of its schedule and
    # the time the generator took to send it (its send times, where recorded; else the step's wall time,
    # which also holds the drain after the last send). Fewer requests than half of that, beyond three
    # Poisson deviations, is no such rate.
    sent = frame["sent_at"].to_numpy(float) if "sent_at" in frame else np.array([])
    sent = sent[np.isfinite(sent)]
    took = float(sent.max()) if len(sent) else seconds
    expected = rate * max(duration, took)
    if n < 0.5 * expected - 3.0 * math.sqrt(expected):
        over, p99 = n, math.inf
    return Step(rate, duration, n, over, p99, cpu_per_request=float(row.get("cpu_per_request", math.nan)),
                round=rnd, seconds=seconds)


class TuneRecords:
    """The records of a tune in ``out``: one cell per W x T x wait policy, rewritten at each measured step.

    Parameters
    ----------
    out : str
        The tune's folder (held by the caller with :func:`~tuna_lab.measure.store.lock_folder`).
    sla : float
        The p99 target (seconds), to turn stored steps back into the race's.
    """

    def __init__(self, out, sla):
        self.out, self.sla = out, sla
        self.cells = {}          # key -> [config, base manifest or None, [(row, frame, threads)]]
        self.counts = {}         # (key, policy) -> the next trial number

    def add(self, config, row, frame, threads, meta):
        """Keep one measured step of the cell ``config`` and write its cell at once (whole, atomically).

        ``meta()`` gives the cell's manifest (called once per cell: it reads the machine).
        """
        entry = self.cells.setdefault(config.key, [config, None, []])
        entry[2].append((row, frame, threads))
        key = (config.key, row["policy"])
        self.counts[key] = max(self.counts.get(key, 0), int(row["trial"]) + 1)
        if entry[1] is None:
            entry[1] = meta()
        self.write_cell(config.key)

    def next_trial(self, config, policy):
        """The trial number the next run of ``policy`` in the cell ``config`` takes (after those on disk)."""
        return self.counts.get((config.key, policy), 0)

    def write_cell(self, key, extra=None):
        """Write the cell ``key`` with every step kept so far (``extra``: more manifest entries)."""
        from ..experiment import Result
        from ..store import write_cell

        _, base, measured = self.cells[key]
        rows = pd.DataFrame([row for row, _, _ in measured])
        frames = [frame for _, frame, _ in measured if frame is not None and len(frame)]
        threads = [t for _, _, t in measured if t is not None and len(t)]
        meta = {**(base or {}), "policies": sorted({str(p) for p in rows["policy"]}), "trials": len(rows),
                "latency": sorted({str(x) for x in rows["latency"]}) if "latency" in rows else [],
                "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **(extra or {})}
        result = Result(pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(), rows, meta,
                        threads=pd.concat(threads, ignore_index=True) if threads else None)
        write_cell(os.path.join(self.out, key), result)

    def load(self, configs):
        """The steps already on disk, as ``{candidate name: [Step, ...]}``; they are kept for the next writes.

        ``configs`` maps each cell key this tune may write to its :class:`~tuna_lab.measure.experiment.Config`;
        cells of other keys are left as they are. A cell that cannot be read is refused (:class:`TuneError`):
        a resume never writes over steps it could not read.
        """
        from ..readable import read_table
        from ..store import read_manifest

        prior = {}
        for key, config in configs.items():
            folder = os.path.join(self.out, key)
            if not os.path.lexists(os.path.join(folder, schema.MANIFEST)):
                continue
            try:
                base = read_manifest(folder)
            except (OSError, ValueError) as exc:
                raise TuneError(f"resume: {folder} cannot be read ({exc}); move it away to tune anew") from None
            tables = {}
            for name, table, required in ((schema.TRIALS, "trials", True), (schema.REQUESTS, "requests", True),
                                          (schema.THREADS, "threads", False)):
                tables[table], why = read_table(os.path.join(folder, name), table, required)
                if why:
                    raise TuneError(f"resume: {folder}: {why}; move it away to tune anew")
            trials, requests, threads = tables["trials"], tables["requests"], tables["threads"]
            need = {"policy", "trial", "rate", "step_duration", "round", "step", "candidate"}
            if not need <= set(trials.columns):
                raise TuneError(f"resume: {folder} holds no tune's steps (its trials lack "
                                f"{', '.join(sorted(need - set(trials.columns)))}); move it away to tune anew")
            measured = []
            for _, row in trials.iterrows():
                row = {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
                at = ((requests["trial"] == row["trial"]) & (requests["policy"] == row["policy"])) \
                    if len(requests) and {"trial", "policy"} <= set(requests.columns) else None
                frame = requests[at].reset_index(drop=True) if at is not None else pd.DataFrame()
                mine = None
                if threads is not None and len(threads) and {"trial", "policy"} <= set(threads.columns):
                    mine = threads[(threads["trial"] == row["trial"]) & (threads["policy"] == row["policy"])]
                measured.append((row, frame, mine))
                key_policy = (key, row["policy"])
                self.counts[key_policy] = max(self.counts.get(key_policy, 0), int(row["trial"]) + 1)
                prior.setdefault(row["candidate"], []).append(step_of(row, frame, self.sla, int(row["round"]) - 1))
            base = {k: v for k, v in base.items() if k not in ("valid_trials", "valid_by_policy")}
            self.cells[key] = [config, base, measured]
        return prior
