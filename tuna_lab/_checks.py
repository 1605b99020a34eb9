"""The one set of input validators every stage uses.

Each validator takes the name the user knows the value by and the exception
class of the calling stage, so a bad ``batch`` in the load generator raises
:class:`~tuna_lab.errors.LoadError` and a bad ``workers`` in the model raises
:class:`~tuna_lab.errors.ModelError`, both with the same one-line message.
This module imports nothing heavier than numpy.

Examples
--------
>>> from tuna_lab.errors import ModelError
>>> positive_int("workers", 4, ModelError)
4
>>> parse_cpulist("0-3,8,10-11")
(0, 1, 2, 3, 8, 10, 11)
"""

import math
import numbers
import re

from .errors import TopologyError, TunaError

__all__ = ["iterable", "positive_int", "non_negative_int", "positive_number", "parse_cpulist", "parse_cpumask",
           "format_cpulist", "one_line", "shorten", "MAX_CPU_ID", "MAX_LOGICAL_CPUS", "MAX_THREADS", "check_size",
           "check_cpus", "spec_or_default", "printable"]


def iterable(value):
    """Whether ``value`` can be iterated (a list, a set, a range, an array, a generator ...).

    Examples
    --------
    >>> iterable([1, 2]), iterable(3.5)
    (True, False)
    """
    try:
        iter(value)
    except TypeError:
        return False
    return True


def _is_int(value):
    # bool is an int subclass; "True workers" is a bug, not a request. numpy's integers are
    # Integral (numpy registers them), its bool_ is not: no numpy import needed to tell them apart.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def positive_int(name, value, error=TunaError):
    """``value`` as an int, or raise ``error`` if it is not an integer >= 1."""
    if not _is_int(value) or value < 1:
        raise error(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def non_negative_int(name, value, error=TunaError):
    """``value`` as an int, or raise ``error`` if it is not an integer >= 0."""
    if not _is_int(value) or value < 0:
        raise error(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def positive_number(name, value, error=TunaError):
    """``value`` as a float, or raise ``error`` if it is not a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise error(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


_RANGE = re.compile(r"\s*(\d+)(?:-(\d+))?\s*", re.ASCII)
#: Largest CPU id any reader accepts. Linux builds for at most 8192 CPUs (CONFIG_NR_CPUS); a larger id
#: is a typo, and a range up to it would be expanded into a list of billions.
MAX_CPU_ID = 65535
#: Most logical CPUs of one topology. Its distance matrix is C x C floats, and ``topology --json``
#: writes it as text: about 1 GB of memory at this size, four times that at Linux's 8192.
MAX_LOGICAL_CPUS = 4096
#: Most threads of one server, workers x threads per worker (W x T). A mapping's local search holds
#: (W*T)^2 matrices of floats: about 1.3 GB at this size.
MAX_THREADS = 8192


def spec_or_default(name, value, cls, error=TunaError):
    """``value``, or a default ``cls()`` for None; raise ``error`` for an object of another type.

    A spec (``LoadSpec``, ``ServerLimits``...) checks its own fields when it is made, so the function
    that takes one only has to know it got one: a dict or a keyword left over from an older signature is
    refused in one line that names the type expected.
    """
    if value is None:
        return cls()
    if not isinstance(value, cls):
        article = "an" if cls.__name__[0] in "AEIOU" else "a"
        raise error(f"{name} must be {article} {cls.__name__}, got {type(value).__name__}")
    return value


def check_size(workers, threads, error=TunaError):
    """``(workers, threads)`` as ints, or raise ``error``: each a positive integer, W x T at most :data:`MAX_THREADS`.

    The one bound on a server's size, checked by every stage that is given one
    (the model, the CLI's commands) before anything is sized by it.

    Examples
    --------
    >>> check_size(4, 2)
    (4, 2)
    >>> check_size(10**9, 1)
    Traceback (most recent call last):
    ...
    tuna_lab.errors.TunaError: workers x threads must be at most 8192, got 1000000000 x 1
    """
    workers = positive_int("workers", workers, error)
    threads = positive_int("threads", threads, error)
    if workers * threads > MAX_THREADS:
        raise error(f"workers x threads must be at most {MAX_THREADS}, got {_short(workers)} x {_short(threads)}")
    return workers, threads


def check_cpus(cpus, where="topology", error=TopologyError):
    """Refuse more than :data:`MAX_LOGICAL_CPUS` CPUs, or an id above :data:`MAX_CPU_ID`, with one line.

    ``cpus`` is a sized collection of ints (a reader's CPU ids); ``where``
    names its source for the message. Every topology reader calls this before
    it builds anything whose size grows with the CPUs.

    Examples
    --------
    >>> check_cpus(range(8), "x")
    >>> check_cpus([0, 70000], "x.xml")
    Traceback (most recent call last):
    ...
    tuna_lab.errors.TopologyError: x.xml: CPU id 70000 is above 65535
    """
    if len(cpus) > MAX_LOGICAL_CPUS:
        raise error(f"{where}: {len(cpus)} logical CPUs, more than the {MAX_LOGICAL_CPUS} a topology may have")
    top = max(cpus, default=0)
    if top > MAX_CPU_ID:
        raise error(f"{where}: CPU id {_short(top)} is above {MAX_CPU_ID}")


def _short(number):
    """An integer for a message: as is, or its digit count when it is absurdly long."""
    text = str(number)
    return text if len(text) <= 24 else f"a {len(text)}-digit number"
_MASK_WORD = re.compile(r"\s*([0-9a-fA-F]{1,8})\s*")


def _file_text(text):
    """``text`` as a C reader of a sysfs file sees it: cut at the first NUL, surrounding whitespace gone."""
    # Kernel files (and dumps copied from them) may end in NUL padding after
    # the newline; hwloc reads them as C strings, so anything after a NUL is not content.
    return str(text).split("\x00", 1)[0].strip()


def parse_cpulist(text, where="cpulist", error=TopologyError):
    """Linux cpulist syntax (``"0-3,8,10-11"``) to a tuple of CPU ids.

    ``where`` names the file or option the text came from, for the message.
    Surrounding whitespace and trailing NUL bytes (as sysfs dumps may hold)
    are ignored; an empty list is ``()``.

    Examples
    --------
    >>> parse_cpulist("0-3\\n\\x00")
    (0, 1, 2, 3)
    """
    cpus = []
    for item in filter(None, _file_text(text).split(",")):
        m = _RANGE.fullmatch(item)
        if not m or (m.group(2) and int(m.group(2)) < int(m.group(1))):
            raise error(f"{where}: bad cpulist {text!r}")
        if int(m.group(2) or m.group(1)) > MAX_CPU_ID:
            raise error(f"{where}: CPU id {int(m.group(2) or m.group(1))} is above {MAX_CPU_ID}")
        cpus.extend(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return tuple(cpus)


def parse_cpumask(text, where="cpumask", error=TopologyError):
    """A Linux hex CPU mask (``"00000000,00000f0f"``, as in ``shared_cpu_map``) to a tuple of CPU ids.

    The kernel writes the mask as comma-separated 32-bit words, most
    significant first (the first word may be shorter). Whitespace and
    trailing NUL bytes are ignored, as in :func:`parse_cpulist`.

    Examples
    --------
    >>> parse_cpumask("00000001,00000101\\n")
    (0, 8, 32)
    >>> parse_cpumask("f0")
    (4, 5, 6, 7)
    """
    words = _file_text(text).split(",")
    if words == [""]:
        return ()
    matches = [_MASK_WORD.fullmatch(w) for w in words]
    if not all(matches):
        raise error(f"{where}: bad cpumask {text!r}")
    # Most significant word first, each 32 bits wide: as one integer, bit i is CPU i.
    value = 0
    for m in matches:
        value = (value << 32) | int(m.group(1), 16)
    return tuple(i for i in range(value.bit_length()) if value >> i & 1)


def format_cpulist(cpus):
    """The shortest cpulist string for a set of CPU ids (``{0, 1, 2, 5}`` -> ``"0-2,5"``)."""
    out, ids = [], sorted(set(int(c) for c in cpus))
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def printable(text, limit=300):
    """:func:`shorten` of ``text`` with every character a terminal would act on written as ``?``.

    For what is read from another user's files (a folder's name, a recorded
    reason) and printed: an escape sequence or a carriage return in it would
    reach the reader's terminal.

    Examples
    --------
    >>> printable("cell\\x1b[2J\\rfine")
    'cell?[2J?fine'
    """
    return shorten("".join(c if c.isprintable() or c in " \t\n" else "?" for c in str(text)), limit)


def one_line(exc):
    """The first line of an exception's message: what the CLI and a widget show."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def shorten(text, limit=300):
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters with ``...``.

    What an HTTP error body or a recorded error holds: the message of a
    traceback or a server's reply, never several lines.

    Examples
    --------
    >>> shorten("bad   request", limit=20)
    'bad request'
    >>> shorten("x" * 10, limit=6)
    'xxx...'
    """
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
