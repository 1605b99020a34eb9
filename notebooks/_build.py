"""Re-execute notebooks in place and store their outputs: the reference nbval compares against.

    .venv/bin/python notebooks/_build.py                      # every notebook in this folder
    .venv/bin/python notebooks/_build.py notebooks/02_*.ipynb # some of them
    make notebooks-refresh                                    # the same as the first line

`make test` runs the notebooks with nbval (`pytest --nbval`): every cell must run, and every
output must equal the stored one except in cells tagged `nbval-ignore-output` (timings, live
measurements, process ids, figures, anything that depends on the machine). So after changing a
notebook, or library behaviour a notebook shows, run this script and review the diff of the
stored outputs like any other change.

Each notebook runs top to bottom in a fresh kernel of *this* Python (the project's venv), with
its own folder as the working directory, as nbval runs it. A cell that raises stops the script
and leaves the notebook file untouched. Cell ids and tags are kept; execution timings are not
recorded, so a re-run only changes what the cells print.

Exercise solutions (cells tagged ``solution``) run like every other cell, so nbval still checks
that they work, but their outputs are not stored: a student who opens the notebook sees the
question and an empty "your turn" cell, not the answer printed under it.
"""

import argparse
import sys
import time
from pathlib import Path

import nbformat
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
#: The tag of an exercise's solution cell: executed, its outputs never stored.
SOLUTION = "solution"


class _ThisPython(KernelSpecManager):
    """Every kernel name resolves to an ipykernel of the interpreter running this script."""

    def get_kernel_spec(self, kernel_name):
        return KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                          display_name="Python 3 (ipykernel)", language="python", resource_dir=str(HERE))


def execute(path, timeout=600):
    """Run ``path`` in a fresh kernel and write it back with its new outputs; return seconds taken."""
    path = Path(path).resolve()
    nb = nbformat.read(path, as_version=4)
    km = KernelManager(kernel_spec_manager=_ThisPython(), kernel_name="python3")
    # No widget state: plotly's FigureWidget state carries all of plotly.js (~5 MB).
    client = NotebookClient(nb, km=km, timeout=timeout, record_timing=False, store_widget_state=False,
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.monotonic()
    try:
        client.execute()
    finally:
        if km.has_kernel:          # a kernel we hand in is ours to stop (atexit handlers run)
            km.shutdown_kernel()
    seconds = time.monotonic() - t0
    strip_solutions(nb)
    # Keep the metadata portable: the kernel any Jupyter calls "python3", no interpreter path.
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python",
                                 "name": "python3"}
    nbformat.validate(nb)
    nbformat.write(nb, path)
    return seconds


def strip_solutions(nb):
    """Empty the outputs of every ``solution`` cell of ``nb`` (in place), once it has run without error."""
    for cell in nb.cells:
        if cell.cell_type == "code" and SOLUTION in cell.metadata.get("tags", []):
            cell.outputs = []


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to run (default: every *.ipynb in this folder)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one cell may take")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted(HERE.glob("*.ipynb"))
    total = 0.0
    for path in paths:
        seconds = execute(path, args.timeout)
        total += seconds
        print(f"{seconds:7.1f} s  {path.name}", flush=True)
    print(f"{total:7.1f} s  total")


if __name__ == "__main__":
    main()
