"""Topologies from hwloc XML (v1 and v2), as written by ``lstopo --of xml``.

The reader behind :meth:`Topology.from_hwloc_xml
<tuna_lab.machine.topology.Topology.from_hwloc_xml>`: packages, NUMA nodes (v1
parents or v2 memory children), cores, data and unified caches, PUs, and the
first NUMA latency matrix, which sets ``costs["remote"]``.

Examples
--------
>>> xml = ('<topology><object type="Machine"><object type="Core">'
...        '<object type="PU" os_index="0"/><object type="PU" os_index="1"/>'
...        '</object></object></topology>')
>>> from tuna_lab.machine.topology import Topology
>>> Topology.from_reading(read_hwloc_xml(xml)).siblings()
[(0, 1)]
"""

import io
import itertools
import re
import warnings
from pathlib import Path

import lazy_loader as _lazy
import numpy as np

from ... import _files
from ..._checks import MAX_CPU_ID, MAX_LOGICAL_CPUS
from ...errors import TopologyError
from . import CACHE_LEVELS, Reading

# Loaded when a file is parsed: reading this machine (`tuna-lab topology`) never parses XML.
# lazy_loader warns for any dotted name because it loads the parents first; xml and xml.etree
# are empty packages, so that costs nothing here.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    ET = _lazy.load("xml.etree.ElementTree")

__all__ = ["read_hwloc_xml"]


def read_hwloc_xml(path) -> Reading:
    """The :class:`~tuna_lab.machine.readers.Reading` of hwloc XML (what
    :meth:`Topology.from_hwloc_xml <tuna_lab.machine.topology.Topology.from_hwloc_xml>` builds on).

    Parameters
    ----------
    path : str, path or file-like
        A file name, an open file, or the XML text itself (``bytes``, or a
        ``str`` starting with ``"<"``); the topology is named after the file.

    Raises
    ------
    TopologyError
        The file cannot be read, is not XML, is not hwloc's, or has no (or
        duplicate) PUs.

    Examples
    --------
    >>> read_hwloc_xml(b'<topology><object type="PU" os_index="3"/></topology>').cpus
    (3,)
    """
    name, root = _parse(path)
    pus = []  # (os_index, {kind: key}) for every PU, in document order
    counter = itertools.count()  # unique keys for the objects met

    def visit(obj, ctx):
        """This object's context for its children; None for a PU (recorded, no children)."""
        kind = obj.get("type", "")
        ctx = dict(ctx)
        if kind in ("Package", "Socket"):
            ctx["package"] = next(counter)
        elif kind == "NUMANode":  # hwloc v1: NUMA nodes are ordinary parents
            ctx["numa"] = obj.get("os_index", next(counter))
        elif kind == "Core":
            ctx["core"] = next(counter)
        elif (level := _cache_level(obj)) is not None:
            ctx[level] = next(counter)
        elif kind == "PU":
            index = obj.get("os_index")
            if not _decimal(index):
                raise TopologyError(f"{name}: PU without a valid os_index")
            # Bounded as they are met: no list of a million PUs, no id that overflows later.
            if len(index) > 6 or int(index) > MAX_CPU_ID:
                raise TopologyError(f"{name}: PU os_index {index[:24]} is above {MAX_CPU_ID}")
            if len(pus) == MAX_LOGICAL_CPUS:
                raise TopologyError(f"{name}: more than the {MAX_LOGICAL_CPUS} PUs a topology may have")
            pus.append((int(index), ctx))
            return None
        # hwloc v2: NUMA nodes hang below the object whose CPUs they serve.
        memory = _numa_child(obj)
        if memory is not None:
            ctx["numa"] = memory
        return ctx

    # Depth first, in document order, with an explicit stack: a file may nest objects deeper than
    # Python's recursion limit.
    stack = [(top, {}) for top in reversed(root.findall("object"))]
    while stack:
        obj, ctx = stack.pop()
        inner = visit(obj, ctx)
        if inner is not None:
            stack.extend((child, inner) for child in reversed(obj.findall("object")))
    if not pus:
        raise TopologyError(f"{name}: no PU objects in hwloc XML")
    ids = [pu for pu, _ in pus]
    if len(set(ids)) != len(ids):
        raise TopologyError(f"{name}: duplicate PU os_index in hwloc XML")
    ctxs = [pus[i][1] for i in np.argsort(ids)]
    # PUs without a Core parent (or cache) are each their own physical core (domain).
    own = {kind: [c.get(kind, ("own", n)) for n, c in enumerate(ctxs)] for kind in ("core", *CACHE_LEVELS)}
    caches = {lv: own[lv] for lv in CACHE_LEVELS if any(lv in c for c in ctxs)}
    nodes = [c.get("numa") for c in ctxs]
    # hwloc's os_index is 32 bits: a longer one is no id of a node.
    os_ids = [int(n) for n in nodes] if all(_decimal(n) and len(n) <= 9 for n in nodes) else None
    # Without OS ids for the nodes, a latency matrix cannot be matched to them.
    return Reading(name, tuple(sorted(ids)), own["core"], [c.get("package") for c in ctxs], nodes, caches,
                   numa_os_index=os_ids, numa_latency=None if os_ids is None else _numa_latency(root))


def _parse(path):
    """``(name, root element)`` of an hwloc XML file, file object or text."""
    if isinstance(path, bytes) or (isinstance(path, str) and path.lstrip().startswith("<")):
        name, source = "hwloc XML", io.BytesIO(path.encode() if isinstance(path, str) else path)
    elif hasattr(path, "read"):
        name, source = Path(str(getattr(path, "name", "hwloc XML"))).name, path
    else:
        name = Path(path).name
        # Without blocking on a FIFO, a regular file only, at most _files.MAX_FILE_BYTES.
        try:
            source = io.BytesIO(_files.read_bytes(path, error=TopologyError))
        except FileNotFoundError as exc:
            raise TopologyError(f"{name}: cannot read hwloc XML ({exc.strerror})") from None
    try:
        root = ET.parse(source).getroot()
    except ET.ParseError as exc:
        raise TopologyError(f"{name}: malformed hwloc XML ({exc})") from None
    except OSError as exc:
        raise TopologyError(f"{name}: cannot read hwloc XML ({exc.strerror or exc})") from None
    if root.tag != "topology":
        raise TopologyError(f"{name}: not hwloc XML (root element <{root.tag}>, expected <topology>)")
    return name, root


def _cache_level(obj):
    """"L1".."L4" for a data or unified cache object (v1 or v2 XML), else None."""
    kind = obj.get("type", "")
    if obj.get("cache_type") == "2":  # instruction cache
        return None
    m = re.fullmatch(r"L([1-4])Cache", kind)
    if m:
        return f"L{m.group(1)}"
    if kind == "Cache" and obj.get("depth") in ("1", "2", "3", "4"):
        return f"L{obj.get('depth')}"
    return None


def _decimal(text):
    """Whether ``text`` is a string of ASCII digits (``str.isdigit`` also accepts ``"²"``)."""
    return isinstance(text, str) and text.isascii() and text.isdigit()


def _numa_child(obj):
    """os_index of the first NUMA node attached as a memory child (possibly behind MemCache)."""
    for child in obj.iterfind("object"):
        kind = child.get("type")
        # A v2 memory child is a leaf; a v1 NUMA node with children is handled by walk().
        if kind == "NUMANode" and child.find("object") is None:
            return child.get("os_index", "?")
        if kind == "MemCache" and (found := _numa_child(child)) is not None:
            return found
    return None


def _numa_latency(root):
    """``(node os ids, latency matrix)`` of the first NUMA latency matrix in hwloc XML, or ``((), None)``.

    hwloc v2 writes ``<distances2 type="NUMANode" kind=... indexing="os">`` at
    the top, with ``<indexes>`` and ``<u64values>`` split over several
    elements; v1 writes ``<distances nbobjs=...>`` with ``<latency value=...>``
    children inside the object whose NUMA nodes (in document order) they relate.
    Anything that does not fit is ignored.
    """
    for dist in root.iterfind("distances2"):
        kind = dist.get("kind", "")
        # kind bits (hwloc/distances.h): 4 means latency, 8 bandwidth
        if dist.get("type") != "NUMANode" or (_decimal(kind) and not int(kind) & 4):
            continue
        indexes = " ".join(e.text or "" for e in dist.iterfind("indexes")).split()
        values = " ".join(e.text or "" for e in dist.iterfind("u64values")).split()
        if dist.get("indexing", "os") == "gp":
            gp = {o.get("gp_index"): o.get("os_index") for o in root.iter("object")
                  if o.get("type") == "NUMANode"}
            indexes = [gp.get(i, "?") for i in indexes]
        n = len(indexes)
        if n >= 2 and len(values) == n * n and all(_decimal(i) and len(i) <= 9 for i in indexes) \
                and all(_decimal(v) for v in values):
            return [int(i) for i in indexes], np.array(values, dtype=float).reshape(n, n)
    for obj in root.iter("object"):
        for dist in obj.iterfind("distances"):
            nodes = [o.get("os_index", "?") for o in obj.iter("object")
                     if o is not obj and o.get("type") == "NUMANode"]
            values = [v.get("value", "") for v in dist.iterfind("latency")]
            n = len(nodes)
            try:
                matrix = np.array(values, dtype=float).reshape(n, n)
            except ValueError:
                continue
            if n >= 2 and str(n) == dist.get("nbobjs", str(n)) and all(_decimal(i) and len(i) <= 9 for i in nodes):
                return [int(i) for i in nodes], matrix
    return (), None
