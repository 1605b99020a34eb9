#!/usr/bin/env bash
# The article's grid on a bigger machine, in one call of the tool library's `device` (issue 49).
#
# That machine has no package registry and a bare image each time, so this script
#   1. writes what it has (Python, the packages tuna_lab needs, CPUs, the topology tuna_lab reads)
#      to $OUT/stack.txt, before anything else, so a failed run still says why;
#   2. installs what is missing from the wheelhouse `make device-wheelhouse` fills (.whl/, carried);
#   3. runs `tuna-lab sweep --grid article` cut to a budget that leaves the call time to return;
#   4. packs the sweep folder into one file ($OUT brings back at most 8 files, 2 folders down).
#
# Here:   make device-wheelhouse          (about 15 MB for Python 3.12; see docs/maintainers.md)
# There:  device run, carry [".whl"], timeout_s 560, command "bash bench/device_grid.sh"
# Back:   tar -xzf FILES_AT/article-16cpu.tar.gz -C notebooks/data   (then `tuna-lab report` it)
#
# GRID_BUDGET (default 6m) is the sweep's wall time; the machine's start, the install and the pack
# come on top. Locally, OUT=/tmp/x GRID_BUDGET=90s bash bench/device_grid.sh runs it on this machine.
set -u
OUT=${OUT:?OUT is the folder whose files come back}
BUDGET=${GRID_BUDGET:-6m}
NAME=${GRID_NAME:-article-$(nproc)cpu}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."

need="numpy pandas pyarrow scipy psutil networkx threadpoolctl lazy_loader gunicorn xgboost highspy cvxpy"
{
    echo "# $(date -u +%FT%TZ) $(uname -srm)"
    echo "python: $($PY --version 2>&1) at $(command -v $PY)"
    echo "cpus: nproc $(nproc), online $(cat /sys/devices/system/cpu/online 2>/dev/null)"
    for m in $need; do
        $PY -c "import $m, sys; print('$m', getattr($m, '__version__', '?'))" 2>/dev/null || echo "$m missing"
    done
    echo "cc: $(command -v cc gcc 2>/dev/null | head -1)"
} >"$OUT/stack.txt" 2>&1
cat "$OUT/stack.txt"

if grep -q missing "$OUT/stack.txt"; then
    # The device README's install: no index, no dependency resolution (the wheelhouse names them all).
    ls .whl/*.whl >/dev/null 2>&1 || { echo "packages missing and no .whl/ carried: run make device-wheelhouse" >&2; exit 2; }
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "the wheelhouse did not install" >&2; exit 2; }
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# The load generator's C loop where a compiler and Python's headers are there; without them the sweep
# runs the Python loop and says so in every trial row (generator_engine).
$PY setup.py -q build_ext --inplace >"$OUT/build_ext.log" 2>&1 || echo "no C load loop here (see build_ext.log)"

$PY -m tuna_lab topology --json >"$OUT/topology.json" 2>&1 || echo "topology failed (see topology.json)"
$PY -m tuna_lab sweep --grid article --budget "$BUDGET" --out "/tmp/$NAME" --json >"$OUT/sweep.json" 2>"$OUT/sweep.log"
rc=$?
echo "sweep exit $rc"; tail -5 "$OUT/sweep.log"
# Whatever finished is kept: a sweep writes each cell when it is done.
[ -d "/tmp/$NAME" ] && tar -czf "$OUT/$NAME.tar.gz" -C /tmp "$NAME"
exit $rc
