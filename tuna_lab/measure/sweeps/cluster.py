"""Sweeps across many machines on Dask: one cell per machine at a time, nothing lost, nothing mixed.

Each measuring machine runs one Dask worker with one thread and the
resource :data:`MACHINE_RESOURCE` (the command is :data:`WORKER_COMMAND`)::

    dask worker tcp://scheduler:8786 --nthreads 1 --nworkers 1 --resources machine=1

:func:`sweep_on` sends each cell to one machine as a task that needs that
resource, restricted to that machine's worker, and never sends a machine a
second cell before the first is back: a cell always has its machine to
itself. The cell runs :func:`tuna_lab.measure.experiment.run` there, with
that machine's topology, limits and CPUs; its tables come back as Parquet
bytes with its manifest, and the client writes them under
``<out>/<machine>/<cell>/`` (:func:`~tuna_lab.measure.experiment.machine_name`:
hostname and topology fingerprint; :mod:`~tuna_lab.measure.sweeps.machines`
names and describes each machine). Nothing needs a shared filesystem.

Two ways to spread the grid: every machine runs every cell (``per_machine``,
to compare machine types), or each cell runs once (the default) on a machine
of the first machine's *shape* - its topology up to renaming of the CPU ids,
CPU model, cache sizes and CPU quota (:func:`~tuna_lab.machine.fingerprint.shape`)
- or on any machine (``any_machine``). A cell whose machine is lost moves to
any machine of that shape; each machine's folder keeps its own name
(hostname and fingerprint, unique per host).

Nothing lost, nothing mixed:

* a cell already finished for a machine (spread: for any machine that may
  run it) is skipped, so a re-run resumes;
* each (trial, policy) run is streamed to the client as it finishes (a Dask
  event); when a machine's worker leaves in the middle of a cell, the cell
  is re-queued and the runs it streamed are written apart, to
  ``<out>/<machine>/<cell>.partial``, which no reader counts;
* on Ctrl-C (or SIGTERM in the CLI) no further cell is sent, every finished
  cell is kept, and the running cells stop after their current trial - their
  server stopped by its context manager. A worker killed outright takes its
  Gunicorn with it: the runner starts it with a parent-death signal.

Examples
--------
>>> from dask.distributed import Client
>>> from tuna_lab.measure.experiment import Config
>>> # skipped: needs a Dask scheduler at that address
>>> client = Client("tcp://10.0.0.5:8786")                                    # doctest: +SKIP
>>> sweep_on(client, [Config(2, 2, "small", 100)], ["cfs", "round-robin"], "results/cluster",
...          per_machine=True, progress=print)                                 # doctest: +SKIP
"""

import contextlib
import inspect
import io
import json
import os
import queue
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from importlib import metadata

import pandas as pd

from ..._checks import format_cpulist, one_line, positive_int, positive_number
from ...errors import ExperimentError
from ...machine.reserve import reserve_client_cpus
from .. import schema
from ..experiment import Result, check_policies, run
from ..store import finished_keys, read_manifest, write_cell
from ..trial_spec import specs_of
from .machines import describe_machine, machine_folder

__all__ = ["MACHINE_RESOURCE", "WORKER_COMMAND", "connect", "describe_machine", "machine_folder", "sweep_on"]

#: The Dask worker resource that marks a worker as a whole measuring machine; every cell needs one.
MACHINE_RESOURCE = "machine"
#: How to start the one worker of a measuring machine (``address``: the scheduler's).
WORKER_COMMAND = "dask worker {address} --nthreads 1 --nworkers 1 --resources machine=1"

# The client wakes at once when a cell finishes or sends a line; else every _TICK seconds, and asks the
# scheduler for its workers (joined or gone) every _LOOK seconds: a light load on a scheduler (and on a
# LocalCluster's machine, which measures too).
_TICK = 1.0
_LOOK = 2.0


@contextlib.contextmanager
def connect(address, timeout=10):
    """A Dask client of the scheduler at ``address``, closed on exit; ``"local"`` starts a LocalCluster.

    The local cluster has one worker process with one thread and the
    :data:`MACHINE_RESOURCE`: this machine, as a cluster of one.

    Parameters
    ----------
    address : str
        ``tcp://host:port`` of a running ``dask scheduler``, or ``"local"``.
    timeout : float
        Seconds to wait for the scheduler to answer.

    Yields
    ------
    distributed.Client

    Raises
    ------
    ExperimentError
        Dask distributed is not installed, or the scheduler does not answer
        in time (one line, whatever the cause).

    Examples
    --------
    >>> # skipped: needs a Dask scheduler at that address
    >>> with connect("tcp://10.0.0.5:8786") as client:                       # doctest: +SKIP
    ...     sweep_on(client, configs, ["cfs", "round-robin"], "results/cluster")
    """
    timeout = positive_number("timeout", timeout, ExperimentError)
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ExperimentError("a sweep on a cluster needs Dask distributed: pip install 'tuna_lab[cluster]'") from None
    if address != "local":
        # A malformed address is said before a Client exists: a Client that failed to start waits 20 s
        # in its __del__ at exit, then prints a traceback.
        _check_address(address)
    cluster = None
    try:
        if address == "local":
            # Loopback only: a local cluster (and its dashboard) is nobody else's business.
            cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                                   resources={MACHINE_RESOURCE: 1}, dashboard_address="127.0.0.1:0")
            client = Client(cluster, timeout=timeout, set_as_default=False)
        else:
            _refused_at_once(address)
            client = Client(address, timeout=timeout, set_as_default=False)
    except Exception as exc:  # OSError, TimeoutError, ValueError (a bad scheme), garbage from a non-Dask port
        if cluster is not None:
            cluster.close()
        raise ExperimentError(f"cannot reach the Dask scheduler at {address} within {timeout:g} s: "
                              f"{one_line(exc)}") from None
    try:
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _check_address(address):
    """Raise :class:`ExperimentError` (one line) when Dask cannot parse ``address`` as a scheduler's."""
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        scheme, location = parse_address(address)
        if scheme in ("tcp", "tls"):
            parse_host_port(location)
    except (ValueError, TypeError) as exc:
        raise ExperimentError(f"--cluster {address!r} is not a scheduler address such as tcp://host:8786: "
                              f"{one_line(exc)}") from None


def _refused_at_once(address):
    """Raise ConnectionRefusedError when nothing listens at a ``tcp://host:port`` address.

    Dask's client retries a refused connection until its timeout; a port
    nothing listens on is known at the first try, so it is said at once.
    Other schemes (``tls://``, ``ucx://``), and a host that does not answer
    at all, are left to the client and its timeout.
    """
    import socket
    from urllib.parse import urlsplit

    if not address.startswith("tcp://"):
        return
    try:
        parts = urlsplit(address)
        host, port = parts.hostname, parts.port
    except ValueError:
        return                          # the client says what is wrong with it
    if not host or not port:
        return
    try:
        with socket.create_connection((host, port), timeout=2.0):
            pass
    except ConnectionRefusedError:
        raise
    except OSError:
        return


# -- on the worker -------------------------------------------------------------------------

#: The sweeps (by event topic) told to stop: their cells stop after the current trial.
_STOPPING = set()


class _Stopped(Exception):
    """Raised in a cell whose sweep was interrupted, between two trials."""


def _stop(topic):
    """Run on every worker by an interrupted client (``Client.run``)."""
    _STOPPING.add(topic)


def _to_wire(result):
    """A :class:`Result` as msgpack-able bytes and text: Parquet tables and the manifest as JSON."""
    def parquet(frame):
        if frame is None or frame.empty:
            return None
        buffer = io.BytesIO()
        frame.to_parquet(buffer, index=False)
        return buffer.getvalue()

    return {"requests": parquet(result.requests), "trials": parquet(result.trials),
            "threads": parquet(result.threads), "manifest": json.dumps(result.manifest, default=str)}


def _from_wire(wire):
    def frame(data):
        return pd.read_parquet(io.BytesIO(data)) if data else pd.DataFrame()

    threads = frame(wire["threads"]) if wire["threads"] else None
    return Result(frame(wire["requests"]), frame(wire["trials"]), json.loads(wire["manifest"]), threads=threads)


def _cell(config, policies, trials, requests, options, topic, attempt):
    """One cell on the worker's machine; each finished run and progress line is sent to ``topic`` at once."""
    from distributed import get_worker

    worker = get_worker()
    started = time.monotonic()

    def send(**message):
        worker.log_event(topic, {"attempt": attempt, **message})

    def progress(line):
        send(line=line)
        if topic in _STOPPING:
            raise _Stopped("the sweep was interrupted")

    # The client CPUs are this machine's to choose (CPU ids are per machine): said once per cell.
    options = {**options, "client_cpus": reserve_client_cpus(options.get("client_cpus"), error=ExperimentError)}
    send(line=options["client_cpus"].describe())
    # The options travel as plain values (picklable by any Dask); the specs are made here, on the worker.
    load, trial, rest = specs_of(requests, options)
    result = run(config, policies, trials=trials, load=load, trial=trial, progress=progress,
                 on_trial=lambda part: send(trial=_to_wire(part)), **rest)
    info = describe_machine()
    result.manifest.update(machine=info["machine"], shape=info["shape"], dask_worker=str(worker.name),
                           dask_address=worker.address)
    return {"attempt": attempt, "cell": _to_wire(result), "seconds": time.monotonic() - started}


# -- on the client -------------------------------------------------------------------------


def _import_error(error):
    """The text of an import failure a worker sent back (None for anything else).

    A worker that cannot unpickle the function it is sent (no tuna_lab, or
    an older one without it) answers with an exception the client may not be
    able to rebuild: Dask then hands over ``Exception("ImportError('...')")``.
    """
    if isinstance(error, ImportError):
        return one_line(error)
    if not isinstance(error, BaseException):
        return None
    text = str(error)
    for kind in ("ModuleNotFoundError", "ImportError"):
        if text.startswith(kind + "("):
            inner = text[len(kind) + 1:].rstrip(")").strip("'\"")
            return f"{kind}: {inner}"
    return None


@dataclass
class _Machine:
    """What the client knows of one machine."""

    info: dict
    #: Its live workers (one, normally); cells go to the first.
    addresses: list = field(default_factory=list)
    #: Its cells still to run (per-machine sweeps).
    queue: deque = field(default_factory=deque)
    done: int = 0
    #: Wall seconds of each cell it finished, as the client saw them.
    seconds: list = field(default_factory=list)


@dataclass
class _Attempt:
    """One cell sent to one machine."""

    config: object
    machine: str
    address: str
    id: str
    started: float
    #: The (trial, policy) runs it streamed so far, in wire form.
    runs: list = field(default_factory=list)
    #: How many of them are in its ``.partial`` folder.
    written: int = 0


def sweep_on(client, configs, policies, out, trials=5, requests=1000, progress=None, per_machine=False,
             any_machine=False, worker_wait=60, csv=False, **run_options):
    """Run a sweep's cells on the machines of a Dask cluster; each cell is written under ``out/<machine>/``.

    Parameters
    ----------
    client : distributed.Client
        A client of a scheduler whose workers offer ``machine=1`` (:data:`WORKER_COMMAND`).
    configs, policies : iterable of Config, list of str
        The cells and the policies each runs.
    out : str
        The sweep's folder; cells go to ``out/<machine>/<cell>/``.
    trials, requests : int
        As for :func:`~tuna_lab.measure.experiment.run`.
    progress : callable, optional
        Called with one line of text at a time.
    per_machine, any_machine, csv : bool
        Every cell on every machine; any machine, not only the first one's shape; CSV copies too.
    worker_wait : float
        Seconds to wait for a first machine, and for one to run the cells left.
    **run_options
        ``concurrency``, ``seed``, ``warmup``, ``client_cpus``: as for :func:`~tuna_lab.measure.experiment.run`
        (its :class:`~tuna_lab.measure.trial_spec.LoadSpec` and :class:`~tuna_lab.measure.trial_spec.TrialSpec`).

    Returns
    -------
    str
        ``out``.

    Raises
    ------
    ExperimentError
        Bad options; no machine joined in time; the scheduler went away; some cells failed.
    KeyboardInterrupt
        Re-raised once the finished cells are kept.

    Notes
    -----
    See docs/cluster.md, sections "How it works", "Nothing lost, nothing mixed" and "Progress".

    Examples
    --------
    >>> # skipped: starts a local Dask cluster and runs a sweep on it (tests/test_cluster.py does)
    >>> sweep_on(client, [Config(1, 1, "small", 10)], ["cfs", "round-robin"], "results/c")   # doctest: +SKIP
    """
    policies = check_policies(policies)
    trials = positive_int("trials", trials, ExperimentError)
    requests = positive_int("requests", requests, ExperimentError)
    worker_wait = positive_number("worker_wait", worker_wait, ExperimentError)
    if per_machine and any_machine:
        raise ExperimentError("any_machine spreads each cell over the machines once; per_machine runs every "
                              "cell on every machine: choose one")
    configs = list(dict.fromkeys(configs))
    os.makedirs(out, exist_ok=True)
    # The specs checked here, before any machine is waited for; each worker makes its own from the plain values.
    specs_of(requests, run_options)
    options = {"trials": trials, "requests": requests, **run_options}
    return _Sweep(client, configs, policies, out, options, progress or (lambda line: None), per_machine,
                  any_machine, worker_wait, csv).run()


class _Sweep:
    """The client's side of :func:`sweep_on`: machines, queues, running cells, and the loop over them."""

    def __init__(self, client, configs, policies, out, options, say, per_machine, any_machine, worker_wait, csv):
        self.client, self.configs, self.policies, self.out = client, configs, policies, out
        self.options, self.say, self.csv = options, say, csv
        self.per_machine, self.any_machine, self.worker_wait = per_machine, any_machine, worker_wait
        self.machines = {}       # name -> _Machine
        self.where = {}          # worker address -> machine name
        self.ignored = set()     # worker addresses not used (no resource, another machine type)
        self.reference = None    # the shape a spread sweep keeps to (a fingerprint for an older worker)
        self.reference_fingerprint = None
        self.queue = deque()     # a spread sweep's cells still to run
        self.running = {}        # future -> _Attempt
        self.attempts = {}       # attempt id -> _Attempt, until its cell is written
        self.lost = []           # attempts whose machine left (their runs go to .partial)
        self.failed = []         # (machine, cell, reason)
        self.overhead = []       # client wall time of a cell minus the worker's time for it
        self.stalled = None
        self.stopping = False
        self.topic = f"tuna-lab-sweep-{uuid.uuid4().hex[:12]}"
        # What the cells send (Dask events) and the futures that finished, as they come: the loop waits on it.
        self.inbox = queue.SimpleQueue()
        self.settled = []        # futures that finished, failed or were cancelled, to look at
        self.address = client.scheduler.address

    # -- the loop --

    def run(self):
        started = time.monotonic()
        self.client.subscribe_topic(self.topic, lambda event: self.inbox.put(("event", event)))
        try:
            self._announce()
            self._wait_for_a_machine()
            if not self.per_machine:
                self._plan_spread()
            looked = time.monotonic()
            while self._more():
                if time.monotonic() - looked >= _LOOK:
                    self._refresh()
                    looked = time.monotonic()
                self._dispatch()
                self._collect()
        except KeyboardInterrupt:
            self._interrupt()
            raise
        finally:
            with contextlib.suppress(Exception):
                self.client.unsubscribe_topic(self.topic)
        self._drain()
        for attempt in self.lost:
            if len(attempt.runs) > attempt.written:    # runs that arrived after the machine was seen gone
                self._write_partial(attempt, "its machine left during the cell")
        return self._summary(time.monotonic() - started)

    def _announce(self):
        info = self.client.scheduler_info()
        link = self.client.dashboard_link if "dashboard" in info.get("services", {}) else None
        self.say(f"cluster: scheduler {self.address}" + (f"; Dask dashboard {link}" if link else ""))

    def _wait_for_a_machine(self):
        deadline = time.monotonic() + self.worker_wait
        told = False
        while True:
            self._refresh()
            if any(m.addresses for m in self.machines.values()):
                return
            if not told:
                told = True
                self.say(f"cluster: waiting up to {self.worker_wait:g} s for a measuring machine to join")
            if time.monotonic() > deadline:
                n = len(self._workers())
                command = WORKER_COMMAND.format(address=self.address)
                if n == 0:
                    raise ExperimentError(f"no Dask worker joined the scheduler {self.address} within "
                                          f"{self.worker_wait:g} s: start one on each measuring machine with "
                                          f"`{command}`")
                raise ExperimentError(f"none of the {n} Dask worker(s) of {self.address} offers the "
                                      f"'{MACHINE_RESOURCE}' resource: start one per measuring machine with "
                                      f"`{command}`")
            time.sleep(_TICK)

    def _plan_spread(self):
        if self.any_machine:
            folders = [d for d in os.listdir(self.out) if os.path.isdir(os.path.join(self.out, d))]
            where = "on any machine"
        else:
            folders = [d for d in os.listdir(self.out) if os.path.isdir(os.path.join(self.out, d))
                       and self._of_reference(os.path.join(self.out, d), d)]
            where = f"on machines of shape {self.reference[:8]}"
        done = set().union(*(finished_keys(os.path.join(self.out, d)) for d in folders))
        self.queue = deque(c for c in self.configs if c.key not in done)
        self.say(f"sweep: {len(self.configs) - len(self.queue)} of {len(self.configs)} cells already finished, "
                 f"{len(self.queue)} to run {where}")

    def _of_reference(self, folder, name):
        """Whether the machine folder ``folder`` holds cells of a machine of the reference shape."""
        for cell in sorted(finished_keys(folder)):
            with contextlib.suppress(OSError, ExperimentError):
                recorded = read_manifest(os.path.join(folder, cell)).get("shape")
                if recorded:
                    return recorded == self.reference
        # Cells written before shapes were recorded: the folder's name says its fingerprint.
        return name.endswith(f"-{self.reference_fingerprint[:8]}")

    def _more(self):
        """Whether the loop goes on: cells run, or are queued for a machine that is (or may come) back."""
        if self.running:
            return True
        if self.stopping:
            return False
        waiting = {name: m for name, m in self.machines.items() if m.queue} if self.per_machine else (
            dict(self.machines) if self.queue else {})
        if not waiting:
            return False
        if any(m.addresses for m in waiting.values()):
            self.stalled = None
            return True
        now = time.monotonic()
        if self.stalled is None:
            self.stalled = now
            self.say(f"sweep: {self._left()} cells left and no machine to run them: waiting up to "
                     f"{self.worker_wait:g} s for one to (re)join")
        return now - self.stalled <= self.worker_wait

    def _left(self):
        return sum(len(m.queue) for m in self.machines.values()) if self.per_machine else len(self.queue)

    # -- machines --

    def _workers(self):
        """The scheduler's workers now: address -> its info (resources, name, host)."""
        # Older clients list only the first few workers unless told otherwise.
        all_of_them = {"n_workers": -1} if "n_workers" in inspect.signature(self.client.scheduler_info).parameters \
            else {}
        return self.client.scheduler_info(**all_of_them).get("workers", {})

    def _refresh(self):
        """Take in the workers that joined; re-queue the cells of those that left."""
        if self.client.status in ("closing", "closed"):      # the scheduler went away and did not come back
            raise ExperimentError(f"lost the Dask scheduler at {self.address}: the finished cells are kept in "
                                  f"{self.out}; re-run the same sweep to resume")
        if self.client.status != "running":                  # reconnecting: the workers are unknown meanwhile
            return
        live = self._workers()
        for address in [a for a in self.where if a not in live]:
            name = self.where.pop(address)
            self.machines[name].addresses.remove(address)
            for future, attempt in list(self.running.items()):
                if attempt.address == address:
                    self._lose(future, attempt, "its machine left")
        self.ignored &= set(live)
        new = [a for a in live if a not in self.where and a not in self.ignored]
        for address in [a for a in new if live[a].get("resources", {}).get(MACHINE_RESOURCE, 0) < 1]:
            self.ignored.add(address)
            new.remove(address)
            self.say(f"cluster: worker {address} offers no '{MACHINE_RESOURCE}' resource and is not used; start "
                     f"measuring workers with `{WORKER_COMMAND.format(address=self.address)}`")
        if not new:
            return
        try:
            described = self.client.run(describe_machine, workers=new, on_error="return")
        except Exception:  # a worker left between the listing and the call: the next look sees it gone
            return
        for address, info in described.items():
            missing = _import_error(info)
            if missing:
                # A worker without tuna_lab (or with a broken one) would never join: say so now, not as a
                # missing machine after the wait.
                raise ExperimentError(f"Dask worker {address} cannot import what a cell needs: {missing}; "
                                      "install tuna_lab (pip install 'tuna_lab[cluster]') on every measuring machine")
            if isinstance(info, BaseException):     # it left, or failed to describe itself: looked at again later
                continue
            self._join(address, info)

    def _join(self, address, info):
        # The worker's word for its name becomes a folder: made safe here, where it enters.
        name = machine_folder(info.get("machine"))
        # A machine's kind is its shape (its topology up to the CPU ids): a worker of an older tuna_lab has none.
        kind = info.get("shape") or info["fingerprint"]
        if self.reference is None:
            self.reference = kind
            self.reference_fingerprint = info["fingerprint"]
        if not (self.per_machine or self.any_machine or kind == self.reference):
            self.ignored.add(address)
            self.say(f"cluster: machine {name} ({address}) is of another shape than the first machine "
                     f"(shape {self.reference[:8]}) and is not used; --any-machine spreads over every machine")
            return
        self.where[address] = name
        machine = self.machines.get(name)
        if machine is not None:
            machine.addresses.append(address)
            self.say(f"cluster: machine {name} has {len(machine.addresses)} workers ({address} joined); it still "
                     "runs one cell at a time")
            return
        machine = self.machines[name] = _Machine(info, [address])
        limits = info["limits"]
        self.say(f"cluster: machine {name}: {info['cpu_model']}, {len(info['cpus'])} CPUs "
                 f"({format_cpulist(info['cpus'])}), quota {limits['quota'] or 'none'}, kernel {info['kernel']}, "
                 f"worker {address}")
        self._check_machine(name, info)
        if self.per_machine:
            done = finished_keys(os.path.join(self.out, name))
            machine.queue = deque(c for c in self.configs if c.key not in done)
            self.say(f"sweep: [{name}] {len(self.configs) - len(machine.queue)} of {len(self.configs)} cells "
                     f"already finished, {len(machine.queue)} to run")

    def _check_machine(self, name, info):
        """Warn about a machine whose CPU quota throttles the largest cell, or whose tuna_lab differs."""
        from ...machine.limits import Limits

        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in info["limits"].items()
                  if k not in ("usable", "effective_cpus")}
        limits = Limits(**fields)
        threads = min(max(c.workers * c.threads for c in self.configs), len(limits.usable))
        if limits.throttles(threads):
            self.say(f"cluster: warning: machine {name}'s CPU quota {limits.quota:g} CPUs is below the {threads} "
                     "CPUs the largest cell runs on: its latencies will measure throttling, not placement")
        mine = metadata.version("tuna_lab")
        if info["tuna_lab"] != mine:
            self.say(f"cluster: warning: machine {name} runs tuna_lab {info['tuna_lab']}, this client {mine}")

    # -- cells --

    def _dispatch(self):
        """Send a cell to every machine that runs none."""
        if self.stopping or self.client.status != "running":
            return
        busy = {attempt.machine for attempt in self.running.values()}
        for name, machine in self.machines.items():
            cells = machine.queue if self.per_machine else self.queue
            if name in busy or not machine.addresses or not cells:
                continue
            config, address = cells.popleft(), machine.addresses[0]
            attempt = _Attempt(config, name, address, uuid.uuid4().hex, time.monotonic())
            future = self.client.submit(
                _cell, config, self.policies, self.options["trials"], self.options["requests"],
                {k: v for k, v in self.options.items() if k not in ("trials", "requests")}, self.topic, attempt.id,
                key=f"tuna-lab-{config.key}-{attempt.id[:8]}", pure=False, workers=[address],
                allow_other_workers=False, resources={MACHINE_RESOURCE: 1})
            self.running[future] = attempt
            self.attempts[attempt.id] = attempt
            future.add_done_callback(lambda f: self.inbox.put(("done", f)))

    def _collect(self):
        """Wait a little for a cell; write the finished ones; forward the workers' lines."""
        self._drain(wait=_TICK)
        settled, self.settled = self.settled, []
        for future in settled:
            attempt = self.running.get(future)
            if attempt is None:         # cancelled by this client: already handled
                continue
            if future.status == "finished":
                self._write(future, attempt)
            elif future.status == "error":
                self._fail(future, attempt)
            else:
                self._lose(future, attempt, "its result was lost")

    def _drain(self, wait=0.0):
        """Take what came in: forward the cells' lines, keep their runs, note the settled futures.

        Waits up to ``wait`` seconds for the first item.
        """
        while True:
            try:
                kind, item = self.inbox.get(timeout=wait) if wait else self.inbox.get_nowait()
            except queue.Empty:
                return
            wait = 0.0
            if kind == "done":
                self.settled.append(item)
                continue
            _, message = item
            attempt = self.attempts.get(message.get("attempt"))
            if attempt is None:         # its cell was written already (or it is another sweep's)
                continue
            if "trial" in message:
                attempt.runs.append(message["trial"])
            if "line" in message:
                self.say(f"  [{attempt.machine}] {message['line']}")

    def _write(self, future, attempt):
        try:
            value = future.result()
        except Exception:               # its worker left before the result was fetched
            self._lose(future, attempt, "its result was lost")
            return
        del self.running[future]
        self.attempts.pop(attempt.id, None)
        future.release()
        write_cell(os.path.join(self.out, attempt.machine, attempt.config.key), _from_wire(value["cell"]), self.csv)
        machine = self.machines[attempt.machine]
        machine.done += 1
        wall = time.monotonic() - attempt.started
        machine.seconds.append(wall)
        self.overhead.append(wall - value["seconds"])
        self.say(f"sweep: [{attempt.machine}] {attempt.config.key} done in {wall:.1f} s; {self._status()}")

    def _fail(self, future, attempt):
        reason = one_line(future.exception())
        del self.running[future]
        future.release()
        self.failed.append((attempt.machine, attempt.config.key, reason))
        where = self._write_partial(attempt, f"the cell failed: {reason}")
        self.attempts.pop(attempt.id, None)
        self.say(f"sweep: [{attempt.machine}] {attempt.config.key} failed: {reason}"
                 + (f"; its finished runs are in {where}" if where else ""))

    def _lose(self, future, attempt, reason):
        """The cell's machine left (or its result did): re-queue the cell, keep its runs apart."""
        del self.running[future]
        future.cancel()
        self._drain()
        (self.machines[attempt.machine].queue if self.per_machine else self.queue).appendleft(attempt.config)
        self.lost.append(attempt)
        where = self._write_partial(attempt, reason)
        self.say(f"sweep: [{attempt.machine}] {reason} during {attempt.config.key}: the cell is queued again"
                 + (f"; its {len(attempt.runs)} finished runs are kept apart in {where}" if where else ""))

    def _write_partial(self, attempt, reason):
        """Write the runs a cell streamed to ``<out>/<machine>/<cell>.partial`` (None if there are none)."""
        if not attempt.runs:
            return None
        parts = [_from_wire(run_) for run_ in attempt.runs]

        def concat(frames):
            frames = [f for f in frames if f is not None and not f.empty]
            return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

        manifest = {**parts[0].manifest, "machine": attempt.machine, "interrupted": True, "reason": reason}
        threads = concat([p.threads for p in parts])
        result = Result(concat([p.requests for p in parts]), concat([p.trials for p in parts]), manifest,
                        threads=threads if not threads.empty else None)
        path = os.path.join(self.out, attempt.machine, attempt.config.key + schema.PARTIAL_SUFFIX)
        write_cell(path, result, self.csv)
        attempt.written = len(attempt.runs)
        return path

    # -- the end --

    def _interrupt(self):
        """Send no more cells, tell the running ones to stop after their trial, keep what they sent."""
        self.stopping = True
        self.say("sweep: interrupted: no more cells are sent; the finished cells are kept; the running ones stop "
                 "after their current trial")
        addresses = sorted({attempt.address for attempt in self.running.values()})
        if addresses:
            with contextlib.suppress(Exception):
                self.client.run(_stop, self.topic, workers=addresses)
        self._drain()
        for future, attempt in list(self.running.items()):
            future.cancel()
            self._write_partial(attempt, "the sweep was interrupted")
        self.running.clear()

    def _status(self):
        """Each machine's cells done, running and queued, and the time left."""
        parts, left = [], 0.0
        every = [s for m in self.machines.values() for s in m.seconds]
        mean = sum(every) / len(every) if every else float("nan")
        for name, machine in self.machines.items():
            running = sum(a.machine == name for a in self.running.values())
            queued = len(machine.queue) if self.per_machine else 0
            parts.append(f"{name}: {machine.done} done" + (", 1 running" if running else "")
                         + (f", {queued} queued" if self.per_machine else ""))
            own = sum(machine.seconds) / len(machine.seconds) if machine.seconds else mean
            left = max(left, (queued + running) * own)
        if not self.per_machine:
            active = max(1, sum(bool(m.addresses) for m in self.machines.values()))
            left = (len(self.queue) + len(self.running)) * mean / active
            parts.append(f"{len(self.queue)} queued")
        return "; ".join(parts) + (f"; ~{left:.0f} s left" if left == left else "")

    def _summary(self, wall):
        done = sum(m.done for m in self.machines.values())
        overhead = sum(self.overhead) / len(self.overhead) if self.overhead else float("nan")
        self.say(f"sweep: {done} cells in {wall:.1f} s on {len(self.machines)} machine(s)"
                 + (f"; dispatch overhead {overhead:.2f} s per cell" if self.overhead else ""))
        unrun = self._left()
        if self.failed or unrun:
            what = [f"{len(self.failed)} failed (first: {self.failed[0][1]} on {self.failed[0][0]}: "
                    f"{self.failed[0][2]})"] if self.failed else []
            if unrun:
                what.append(f"{unrun} not run: no machine was left to run them")
            raise ExperimentError(f"sweep incomplete: {'; '.join(what)}; re-run the same sweep to resume")
        return self.out
