"""The load generator's own limits: ``.venv/bin/python bench/load_bench.py``.

Runs :func:`tuna_lab.measure.loadgen.load.measure_generator` against a trivial
endpoint on 127.0.0.1 (in a process of its own) and checks two targets:

* closed mode drives at least 2,000 requests/s;
* open mode at 1,000 requests/s sends with a p99 send lag of at most 1 ms.

A generator that misses them would show its own limits as the server's. The
side-by-side check against Debian's wrk on a real server is ``tuna-lab bench
load`` (what ``make bench`` runs; it includes the open-loop line too).
These are benchmarks, not tests: PASS/FAIL is printed, the exit status is 0.
Other work on the machine shows in the numbers: run it on a quiet machine,
and more than once.
"""

import argparse
import json
import os
import platform
import sys

from tuna_lab.measure.loadgen.load import measure_generator

TARGET_RPS = 2000.0
TARGET_LAG = 0.001


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="open-mode rate (requests/s)")
    parser.add_argument("--duration", type=float, default=3.0, help="open-mode seconds")
    parser.add_argument("--requests", type=int, default=3000, help="closed-mode requests")
    parser.add_argument("--concurrency", type=int, default=16, help="closed-mode requests in flight")
    parser.add_argument("--json", action="store_true", help="print the raw result as JSON too")
    args = parser.parse_args(argv)

    print(f"# load generator bench  (python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    r = measure_generator(rate=args.rate, duration=args.duration, requests_closed=args.requests,
                          concurrency=args.concurrency)
    rps_ok = r["closed_rps"] >= TARGET_RPS
    lag_ok = r["send_lag_p99"] <= TARGET_LAG
    print(f"closed mode: {r['closed_requests']} requests, {r['concurrency']} in flight, "
          f"{r['closed_seconds']:.3f} s, {r['closed_failed']} failed")
    print(f"  requests/s        {r['closed_rps']:10.0f}   target >= {TARGET_RPS:.0f}   "
          f"{'PASS' if rps_ok else 'FAIL'}")
    print(f"  CPU per request   {1e6 * r['closed_cpu_per_request']:10.1f} us (the generator thread's)")
    print(f"open mode: {r['rate']:.0f} requests/s for {r['duration']:.1f} s, {r['open_requests']} requests, "
          f"{r['open_failed']} failed")
    print(f"  CPU per request   {1e6 * r['open_cpu_per_request']:10.1f} us")
    print(f"  send lag p50      {1e3 * r['send_lag_p50']:10.3f} ms")
    print(f"  send lag p99      {1e3 * r['send_lag_p99']:10.3f} ms   target <= {1e3 * TARGET_LAG:.0f} ms   "
          f"{'PASS' if lag_ok else 'FAIL'}")
    print(f"  send lag max      {1e3 * r['send_lag_max']:10.3f} ms")
    print(f"  client p99        {1e3 * r['open_client_p99']:10.3f} ms   (trivial endpoint, from schedule)")
    if args.json:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
