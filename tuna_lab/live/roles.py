"""Which children of a running server's master are its workers, front ends and helpers.

A server is a master process and its children. Not every child serves
requests: :func:`server_roles` tells the **workers** (the processes that run
an inference runtime, or accept on the server's socket) from **front ends**
(an API process that answers HTTP and passes requests on over a queue) and
**helpers** (a multiprocessing Manager or resource tracker, a metrics
exporter), each with the reason; only workers get a slot. ``--worker-pids`` and
``--worker-match`` (:class:`WorkerChoice`) name them where the discovery
cannot.
"""

import os
import re
import time
from dataclasses import dataclass

import psutil

from .._checks import printable
from ..errors import PinError
from .pools import loaded_runtimes

__all__ = ["WorkerChoice", "ProcessRole", "ServerRoles", "server_roles", "settled_roles", "worker_pids",
           "check_server", "listening_ports"]

# Children of a master that are no workers, by their command line: uvicorn --workers and MLServer start their
# workers with multiprocessing's spawn, which first starts a resource tracker (and forkserver, a fork server).
_HELPER_PROCESSES = (("multiprocessing.resource_tracker", "multiprocessing's resource tracker"),
                     ("multiprocessing.forkserver", "multiprocessing's fork server"))



# The worker count a server's command line asks for, by program: a master still starting its workers
# (Gunicorn forks them one by one, 0-0.1 s apart, later on a busy machine) shows fewer than it will run.
# The command line wins over a config file in both (Gunicorn's settings order, uvicorn's only source).
_WORKER_OPTIONS = (("gunicorn", ("-w", "--workers")),
                   ("uvicorn", ("--workers",)))

#: How long a server's workers must stay the same (no worker started or gone) before they are counted.
SETTLE_SECONDS = 1.0
#: How long :func:`settled_roles` waits for that at most.
SETTLE_WAIT_SECONDS = 15.0

# -- finding workers and threads ---------------------------------------------------------------

# The longest --worker-match pattern taken (a pattern names a worker's command, not a program).
_MAX_PATTERN = 512


def _nests_repeats(text):
    r"""Whether pattern ``text`` has a repeat (``*``, ``+``, ``{n,}``) inside another repeat.

    Examples
    --------
    >>> _nests_repeats(r"^(\S+\s?)*Z$"), _nests_repeats(r"inference_worker \d+"), _nests_repeats(r"(ab)+c")
    (True, False, False)
    """
    from re import _constants as c
    from re import _parser

    repeats = {c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", c.MAX_REPEAT)}

    def walk(items, inside):
        for op, av in items:
            if op in repeats:
                lo, hi, sub = av
                if hi > 1 and inside:
                    return True
                if walk(sub, inside or hi > 1):
                    return True
            elif op is c.BRANCH:
                if any(walk(branch, inside) for branch in av[1]):
                    return True
            elif op is c.SUBPATTERN:
                if walk(av[-1], inside):
                    return True
            elif op in (c.ASSERT, c.ASSERT_NOT):
                if walk(av[1], inside):
                    return True
        return False

    return walk(_parser.parse(text), False)


@dataclass(frozen=True)
class WorkerChoice:
    """Which processes are the workers when the user says so, overriding :func:`server_roles`' discovery.

    ``pids``: the worker PIDs (``--worker-pids PID,PID``), each a descendant of
    the master; ``match``: a regular expression searched for in every
    descendant's command line (``--worker-match REGEX``). Empty: discover.

    Examples
    --------
    >>> WorkerChoice.parse("12, 7", None).pids
    (12, 7)
    >>> WorkerChoice.parse(None, "inference_worker").match.pattern
    'inference_worker'
    >>> WorkerChoice.parse("12,x", None)
    Traceback (most recent call last):
    ...
    tuna_lab.errors.PinError: --worker-pids takes PIDs separated by commas (e.g. 4121,4122), got '12,x'
    """

    pids: tuple = ()
    match: object = None

    @classmethod
    def parse(cls, pids=None, match=None):
        """From the options' text: ``pids`` ``"PID,PID"`` and ``match`` a regular expression; PinError if bad."""
        if pids is not None and match is not None:
            raise PinError("give either --worker-pids or --worker-match, not both")
        found = ()
        if pids is not None:
            try:
                found = tuple(int(p) for p in str(pids).split(","))
            except ValueError:
                found = ()
            if not found or any(p <= 0 for p in found) or len(set(found)) != len(found):
                raise PinError(f"--worker-pids takes PIDs separated by commas (e.g. 4121,4122), got {pids!r}")
        pattern = None
        if match is not None:
            if len(str(match)) > _MAX_PATTERN:
                raise PinError(f"--worker-match takes a pattern of at most {_MAX_PATTERN} characters")
            try:
                pattern = re.compile(str(match))
            except re.error as exc:
                raise PinError(f"--worker-match {match!r} is not a regular expression: {exc}") from None
            if _nests_repeats(str(match)):
                # Python's engine backtracks: a repeat inside a repeat ('(\S+\s?)*') can take exponential time
                # on a command line it does not match. Refused at once, rather than run without end.
                raise PinError(f"--worker-match {match!r} nests a repeat in a repeat, which can backtrack without "
                               "end: write it without the nested quantifier (e.g. 'worker' or '\\S+ worker')")
        return cls(found, pattern)

    def __bool__(self):
        return bool(self.pids) or self.match is not None


@dataclass(frozen=True)
class ProcessRole:
    """One process of a server: PID, ``role`` (``master``, ``worker``, ``front end``, ``helper``), why, command."""

    pid: int
    role: str
    why: str
    command: str = ""

    def to_dict(self):
        return {"pid": self.pid, "role": self.role, "why": self.why, "command": self.command}


@dataclass(frozen=True)
class ServerRoles:
    """The processes of a server by role: its master, its workers (oldest first) and the rest (helpers)."""

    master: ProcessRole
    workers: tuple
    helpers: tuple

    @property
    def worker_pids(self):
        return [w.pid for w in self.workers]

    def left_out(self):
        """The helpers as ``PID (role: why)`` text, for an error that says who was not counted."""
        return "; ".join(f"{h.pid} ({h.role}: {h.why})" for h in self.helpers) or "none"


@dataclass(frozen=True)
class _Facts:
    """What /proc says of one process: start time, command, inference runtimes, TCP and Manager sockets."""

    pid: int
    started: float
    command: str
    runtimes: tuple
    listening: frozenset
    ports: frozenset
    connections: int
    manager: str


def _facts(proc):
    """The :class:`_Facts` of a psutil process; None if it is gone or a zombie."""
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        try:
            command = " ".join(proc.cmdline())
        except psutil.AccessDenied:
            command = ""
        tcp = proc.net_connections("tcp")
        unix = proc.net_connections("unix")
        started = proc.create_time()
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        raise PinError(f"permission denied: cannot read the sockets of process {proc.pid}") from None
    listening = frozenset(c.laddr.port for c in tcp if c.laddr and c.status == psutil.CONN_LISTEN)
    ports = frozenset(c.laddr.port for c in tcp if c.laddr)
    connected = sum(1 for c in tcp if c.status == psutil.CONN_ESTABLISHED)
    # multiprocessing.Manager() serves its proxies on a socket in a pymp-* folder of its own.
    manager = next((c.laddr for c in unix if isinstance(c.laddr, str) and "/pymp-" in c.laddr
                    and os.path.basename(c.laddr).startswith("listener-")), "")
    return _Facts(proc.pid, started, command, tuple(loaded_runtimes(proc.pid)), listening, ports,
                  connected, manager)


def _sockets(f):
    held = [f"listens on port {', '.join(map(str, sorted(f.listening)))}"] if f.listening else []
    if f.connections:
        held.append(f"{f.connections} TCP connection{'' if f.connections == 1 else 's'}")
    return " and ".join(held) or f"TCP sockets on port {', '.join(map(str, sorted(f.ports)))}"


def _runtime_words(f):
    return ", ".join(f.runtimes)


def _discover(master_facts, children):
    """``{pid: (role, why)}`` of ``children`` (:class:`_Facts`) by what each holds and runs; see :func:`server_roles`."""
    roles = {}
    rest = []
    for f in children:
        named = next((what for mark, what in _HELPER_PROCESSES if mark in f.command), None)
        if named:
            roles[f.pid] = ("helper", f"{named} (its command line)")
        elif f.manager:
            roles[f.pid] = ("helper", f"a multiprocessing Manager: it serves proxies on {f.manager}")
        else:
            rest.append(f)
    runtime = [f for f in rest if f.runtimes]
    server_ports = set(master_facts.listening) | {p for f in runtime for p in f.listening}

    def serves(f):
        return bool(f.ports & server_ports) if server_ports else bool(f.ports)

    fed = [f for f in runtime if not f.ports]
    if fed:
        # Runtime processes that hold no socket take their requests over a queue or pipe from a front end.
        for f in fed:
            roles[f.pid] = ("worker", (f"runs {_runtime_words(f)} and holds no TCP socket: it takes its requests "
                                       "over a queue or pipe from the process that answers HTTP"))
    elif runtime:
        for f in runtime:
            roles[f.pid] = ("worker", f"runs {_runtime_words(f)} and {_sockets(f)}: it serves requests itself")
    else:
        for f in rest:
            if serves(f):
                roles[f.pid] = ("worker", (f"{_sockets(f)} (the server's) and loads no known inference runtime: "
                                           "it serves requests itself"))
    for f in rest:
        if f.pid in roles:
            continue
        if serves(f):
            also = (f"; it loads {_runtime_words(f)} too, but the processes that run requests hold no socket"
                    if f.runtimes else " but runs no inference runtime")
            roles[f.pid] = ("front end", f"{_sockets(f)} (the server's){also}: it answers HTTP and passes requests on")
        elif f.ports:
            ports = ", ".join(map(str, sorted(server_ports)))
            roles[f.pid] = ("helper", (f"{_sockets(f)}, not the server's port{'' if len(server_ports) == 1 else 's'} "
                                       f"{ports}, and runs no inference runtime (a metrics exporter or another side "
                                       "service)"))
        else:
            roles[f.pid] = ("helper", "holds no TCP socket and runs no inference runtime")
    return roles


def server_roles(master, choice=None, force=False):
    """The master, workers and helpers of the running server ``master``, each with the reason.

    A **worker** serves requests. Among the master's child processes (not
    multiprocessing's resource tracker or fork server, nor a multiprocessing
    Manager, which are helpers by what they are):

    * the processes that run an inference runtime
      (:func:`~tuna_lab.live.pools.loaded_runtimes`: XGBoost, ONNX
      Runtime, PyTorch, LightGBM, OpenMP) and hold no TCP socket are the
      workers when there are any: they take requests from a front end over a
      queue (LitServe's inference workers, MLServer's parallel workers); the
      processes that hold the server's socket are **front ends**;
    * else every process that runs one (Gunicorn's and uvicorn's workers,
      each accepting on the shared socket);
    * else, when none runs a known runtime, every process that holds the
      server's socket (the master's listening ports) or a TCP connection.

    Any other child is a **helper**: reported, never given a slot or pinned
    (a metrics exporter listens on a port of its own). ``choice``
    (:class:`WorkerChoice`) names the workers instead; ``force`` takes every
    child that is no helper by what it is when none is found a worker.

    Raises
    ------
    PinError
        No such process, no children, no worker found (the message names the
        children and why none counts), or a ``choice`` that names none.
    """
    choice = choice or WorkerChoice()
    try:
        proc = psutil.Process(int(master))
        children = proc.children()
        descendants = proc.children(recursive=True) if choice else children
    except (psutil.NoSuchProcess, ValueError, TypeError):
        raise PinError(f"no process with PID {master}") from None
    except psutil.AccessDenied:
        raise PinError(f"permission denied: cannot see the children of PID {master}") from None
    master_facts = _facts(proc)
    if master_facts is None:
        raise PinError(f"no process with PID {master}")
    facts = [f for f in map(_facts, children) if f is not None]
    if not facts and not choice:
        raise PinError(f"PID {master} has no child processes: not a pre-fork server's master, "
                       "or its workers have not started yet")
    roles = _discover(master_facts, facts)
    head = ProcessRole(int(master), "master", _master_why(master_facts, facts, roles), master_facts.command)
    if choice:
        picked = _chosen(master, choice, descendants)
        by_pid = {f.pid: f for f in facts}
        extra = [f for f in map(_facts, [d for d in descendants if d.pid in picked and d.pid not in by_pid])
                 if f is not None]
        by_pid.update({f.pid: f for f in extra})
        how = "--worker-pids" if choice.pids else f"--worker-match {choice.match.pattern!r}"
        workers = [ProcessRole(p, "worker", f"named by {how}", by_pid[p].command) for p in picked if p in by_pid]
        helpers = [ProcessRole(f.pid, roles[f.pid][0] if roles[f.pid][0] != "worker" else "helper",
                               f"not named by {how}" + ("" if roles[f.pid][0] == "worker" else
                                                         f"; {roles[f.pid][1]}"), f.command)
                   for f in facts if f.pid not in picked]
        gone = [p for p in picked if p not in by_pid]
        if gone:
            # Named, then exited before it was read: a plan for the others would leave its slot to nobody.
            raise PinError(f"worker {gone[0]} named by {how} exited while server {master} was read; "
                           "name the workers it runs now")
        order = {f.pid: f.started for f in by_pid.values()}
        return ServerRoles(head, tuple(sorted(workers, key=lambda w: (order[w.pid], w.pid))), tuple(helpers))
    workers = [f for f in facts if roles[f.pid][0] == "worker"]
    if not workers and force:
        workers = [f for f in facts if not any(mark in f.command for mark, _ in _HELPER_PROCESSES)
                   and not f.manager]
        for f in workers:
            roles[f.pid] = ("worker", f"a child process (--force; {roles[f.pid][1]})")
    helpers = [ProcessRole(f.pid, *roles[f.pid], f.command) for f in facts if roles[f.pid][0] != "worker"]
    out = ServerRoles(head, tuple(ProcessRole(f.pid, "worker", roles[f.pid][1], f.command)
                                  for f in sorted(workers, key=lambda f: (f.started, f.pid))), tuple(helpers))
    if not out.workers:
        name = os.path.basename(master_facts.command.split(" ")[0]) if master_facts.command else "?"
        # A command line is the process owner's to write: no terminal escapes or line breaks into the message.
        name = printable(name, 64)
        raise PinError(f"PID {master} ({name}) is not a recognised pre-fork server: none of its "
                       f"{len(facts)} child process{'' if len(facts) == 1 else 'es'} serves requests (holds a TCP "
                       f"socket or runs an inference runtime): {out.left_out()}; name the workers with --worker-pids "
                       "PID,PID or --worker-match REGEX, or give --force to take every child")
    return out


def _count(text):
    """Whether ``text`` is a worker count as a server's option parser takes one: 1 to 6 ASCII digits, not 0.

    ``str.isdigit`` alone takes "²" (which ``int`` refuses) and 4,000 digits (a command line anyone may write).
    """
    return text.isascii() and text.isdigit() and len(text) <= 6 and int(text) > 0


def _asked_workers(argv):
    """``(count, "the option as written")`` that command line ``argv`` asks its server for, or None.

    Only the servers of ``_WORKER_OPTIONS``, started as ``gunicorn ...``,
    ``python -m gunicorn ...`` or ``python /path/bin/gunicorn ...``.

    Examples
    --------
    >>> _asked_workers(["/usr/bin/python3", "-m", "gunicorn", "-c", "c.py", "-w", "2", "app:application"])
    (2, '-w 2')
    >>> _asked_workers(["/venv/bin/uvicorn", "app:app", "--workers=3"])
    (3, '--workers=3')
    >>> _asked_workers(["gunicorn", "-w4", "app:app"]), _asked_workers(["python", "serve.py", "-w", "2"])
    ((4, '-w4'), None)
    """
    argv = [str(a) for a in argv]
    names = [os.path.basename(a) for a in argv[:3]]
    head = next((i for i, name in enumerate(names) if name in dict(_WORKER_OPTIONS)
                 and (i == 0 or argv[i - 1] == "-m" or names[i - 1].startswith("python"))), None)
    if head is None:
        return None
    options = dict(_WORKER_OPTIONS)[names[head]]
    found = None
    for i, arg in enumerate(argv[head + 1:], head + 1):
        for opt in options:
            if arg == opt and i + 1 < len(argv):
                value, written = argv[i + 1], f"{arg} {argv[i + 1]}"
            elif arg.startswith(opt + "=") or (len(opt) == 2 and arg.startswith(opt) and _count(arg[2:])):
                value, written = arg[len(opt):].lstrip("="), arg
            else:
                continue
            if _count(value):
                found = (int(value), written)          # the last one wins, as argparse and click take it
    return found


def _born(pid):
    """The start time of process ``pid`` (psutil's ``create_time``), or None when it is gone."""
    try:
        return psutil.Process(int(pid)).create_time()
    except psutil.Error:
        return None


def settled_roles(master, choice=None, force=False, settle=SETTLE_SECONDS, wait=SETTLE_WAIT_SECONDS):
    """:func:`server_roles` once the server's workers have stopped changing, or PinError.

    A master that is still starting its workers, or replacing one, shows
    fewer (or other) workers than it will serve with: a run that counted
    them then would send too little load and place too few. So the workers
    are counted when none is younger than ``settle`` seconds, the same
    workers were read ``settle`` seconds apart, and as many run as the
    master's command line asks for (``gunicorn -w N``, ``uvicorn --workers
    N``; not when ``choice`` names them), waiting ``wait`` seconds at most.

    Raises
    ------
    PinError
        What :func:`server_roles` raises, or the workers still changing (or
        fewer than asked for) after ``wait`` seconds: the message says which.
    """
    deadline = time.monotonic() + float(wait)
    asked = born = None
    try:
        proc = psutil.Process(int(master))
        born = proc.create_time()
        asked = None if choice else _asked_workers(proc.cmdline())
    except (psutil.Error, ValueError, TypeError):
        pass                                     # server_roles says what is wrong with the PID
    seen, since = None, time.monotonic()
    while True:
        roles = server_roles(master, choice, force)
        now_born = None if born is None else _born(master)
        if now_born != born:
            # The master exited (and its PID may have gone to another process): its workers are no server's.
            raise PinError(f"server {master} exited while its workers were counted"
                           + (f" (PID {master} is now another process's)" if now_born is not None else ""))
        pids = tuple(roles.worker_pids)
        now = time.monotonic()
        if pids != seen:
            seen, since = pids, now
        youngest = _youngest_age(pids)
        short = asked is not None and len(pids) < asked[0]
        if not short and youngest >= settle and (now - since >= settle or youngest >= 2 * settle):
            return roles
        if now >= deadline:
            break
        time.sleep(min(0.2, max(0.0, deadline - now)))
    if short:
        raise PinError(f"server {master}'s command line asks for {asked[0]} workers ({asked[1]}) and "
                       f"{len(pids)} {'is' if len(pids) == 1 else 'are'} running after {wait:g} s (still starting, "
                       "or failing to start): measure it once all have started, or name the workers with "
                       "--worker-pids PID,PID")
    raise PinError(f"server {master}'s workers are still changing after {wait:g} s (one started or exited in the "
                   f"last {settle:g} s: now {', '.join(map(str, pids))}): measure it once they have settled")


def _youngest_age(pids):
    """Seconds since the youngest of ``pids`` started (0 when one is gone: the set is changing)."""
    now = time.time()
    ages = []
    for pid in pids:
        try:
            ages.append(now - psutil.Process(pid).create_time())
        except psutil.Error:
            return 0.0
    return min(ages, default=0.0)


def _master_why(master, children, roles):
    """Why the master is what it is: a manager of pre-fork workers, or a front end that parses requests itself."""
    if not master.ports:
        return "holds no TCP socket: it starts and watches its children"
    shared = [f for f in children if roles[f.pid][0] == "worker" and f.listening & master.listening]
    if shared:
        return f"{_sockets(master)}, which its workers accept on: it starts and watches them"
    if any(role == "front end" for role, _ in roles.values()):
        return f"{_sockets(master)}, which its front ends answer on: it starts and watches its children"
    return (f"{_sockets(master)} and no child of it answers there: it reads and parses the requests itself and "
            "passes them to its workers (its CPU time is the front end's; only --front-cpus places it)")


def _chosen(master, choice, descendants):
    """The PIDs ``choice`` names among ``descendants`` of ``master``, in its order (PinError if it names none)."""
    live = {}
    for d in descendants:
        try:
            if d.status() != psutil.STATUS_ZOMBIE:
                live[d.pid] = " ".join(d.cmdline())
        except psutil.AccessDenied:
            live[d.pid] = ""
        except psutil.NoSuchProcess:
            continue
    if choice.pids:
        strangers = [p for p in choice.pids if p not in live]
        if strangers:
            raise PinError(f"--worker-pids: process {strangers[0]} is not a live child (or descendant) of server "
                           f"{master}")
        return list(choice.pids)
    picked = [pid for pid, command in live.items() if choice.match.search(command)]
    if not picked:
        raise PinError(f"--worker-match {choice.match.pattern!r} matches the command line of none of the "
                       f"{len(live)} processes under server {master}")
    return picked


def listening_ports(master):
    """The TCP ports server ``master`` or one of its descendants listens on (a URL of this server uses one).

    Raises
    ------
    PinError
        No such process, or its sockets may not be read.

    Examples
    --------
    >>> isinstance(listening_ports(os.getpid()), frozenset)
    True
    """
    try:
        proc = psutil.Process(int(master))
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        raise PinError(f"no process with PID {master}") from None
    ports = set()
    for p in procs:
        facts = _facts(p)
        if facts is not None:
            ports |= facts.listening
    return frozenset(ports)


def worker_pids(master, choice=None, force=False):
    """The master's worker processes, oldest first (their slot order): :func:`server_roles`' workers.

    Raises
    ------
    PinError
        No process ``master``, no children, or no child that serves requests
        (see :func:`server_roles`).
    """
    return server_roles(master, choice, force).worker_pids


def check_server(master, force=False, choice=None):
    """Refuse (:class:`PinError`) to pin ``master`` unless it is a server whose workers are found, or ``force``.

    PID 1 (init, or a container's first process) is always refused unless
    ``force``: its children are the whole system's (or container's)
    services. Any other process is a server's master when :func:`server_roles`
    finds its workers (or ``choice`` names them): a shell whose children are
    ``sleep`` processes is none. The workers are counted once they have
    settled (:func:`settled_roles`). Returns the workers' PIDs.

    Examples
    --------
    >>> check_server(1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tuna_lab.errors.PinError: PID 1 is the system's (or container's) first process, not a server's master; ...
    """
    if int(master) == 1 and not force:
        raise PinError("PID 1 is the system's (or container's) first process, not a server's master; "
                       "give --force to pin its children anyway")
    return settled_roles(master, choice, force).worker_pids

