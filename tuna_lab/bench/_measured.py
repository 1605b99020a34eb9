"""What the load and sampler benches do around their measurement: one lock, one table, one pair of files.

Both measure against a lab server on this machine's CPUs, so both hold the
CPU lock a ``run`` holds, print their table, and write the CSV and the page
they were asked for; kept here once rather than in each bench.
"""

import os

from .. import _files

__all__ = ["header", "measure_and_write"]


def header(name):
    """Print the bench's first line: its command and the load average it starts at."""
    print(f"# tuna-lab bench {name}  (load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})", flush=True)


def measure_and_write(measure, format_table, write_doc, out=None, doc=None):
    """``measure(log)`` under the CPU lock, its table printed, its rows written to ``out`` and its page to ``doc``.

    Returns what ``measure`` returned (a dict with ``"rows"``).
    """
    import pandas as pd

    from ..measure.cpulock import lock_cpus

    def say(line):
        print(line, flush=True)

    # A measurement like run()'s: it waits for (or refuses) another one on these CPUs.
    with lock_cpus(os.sched_getaffinity(0), say):
        result = measure(say)
    lines = format_table(result)
    print("\n" + "\n".join(lines))
    if out:
        _files.write_atomic(out, pd.DataFrame(result["rows"]).to_csv(index=False), parents=True)
        print(f"\nwrote {out}")
    if doc:
        write_doc(doc, result, lines)
        print(f"wrote {doc}")
    return result
