"""The package's shape: the layers' contract (import-linter) holds, and no two modules import each other.

Both read the source only (nothing is imported), in well under a second.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# No exception: neither module-level nor function-local imports may run in a circle.
KNOWN_LOCAL_CYCLES = set()


def import_graph(root, package="tuna_lab", module_level_only=False):
    """``networkx.DiGraph`` of ``package``'s modules under ``root``: an edge for each import of one by another.

    ``from X import name`` counts as importing ``X.name`` when that is a
    module, else ``X``. With ``module_level_only``, imports inside functions
    and classes are left out (those run when the module is imported are kept).
    """
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    graph = nx.DiGraph()
    for module, (path, is_package) in modules.items():
        graph.add_node(module)
        tree = ast.parse(path.read_text(), str(path))
        if module_level_only:
            top = [s for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
            nodes = [n for s in top for n in ast.walk(s)]
        else:
            nodes = list(ast.walk(tree))
        for node in nodes:
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".")[:None if is_package else -1]
                    base = base[:len(base) - node.level + 1] + ([node.module] if node.module else [])
                    base = ".".join(base)
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            graph.add_edges_from((module, t) for t in targets if t in modules and t != module)
    return graph


def cycles(graph):
    return sorted((sorted(c) for c in nx.simple_cycles(graph)), key=lambda c: (len(c), c))


def test_no_module_imports_one_that_imports_it_back():
    assert cycles(import_graph(ROOT, module_level_only=True)) == []
    # A function-local import that closes a cycle only hides it: counted too (lazy_loader is the
    # package's one way to defer an import, and it is not an import statement).
    found = [c for c in cycles(import_graph(ROOT)) if frozenset(c) not in KNOWN_LOCAL_CYCLES]
    assert found == []


def test_the_cycle_check_finds_one(tmp_path):
    pkg = tmp_path / "tuna_lab"
    (pkg / "machine").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "machine" / "__init__.py").write_text("")
    (pkg / "machine" / "topology.py").write_text("def read():\n    from .sysfs import read_sysfs\n")
    (pkg / "machine" / "sysfs.py").write_text("from .topology import Topology\n")
    (pkg / "machine" / "spec.py").write_text("from . import topology\nfrom .. import machine\n")
    assert cycles(import_graph(tmp_path, module_level_only=True)) == []
    assert cycles(import_graph(tmp_path)) == [["tuna_lab.machine.sysfs", "tuna_lab.machine.topology"]]
    assert set(import_graph(tmp_path).successors("tuna_lab.machine.spec")) == {"tuna_lab.machine.topology",
                                                                             "tuna_lab.machine"}


def lint_imports(cwd, env_path):
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(env_path)})


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (pip install -e '.[dev]')")
def test_the_layers_contract_holds():
    p = lint_imports(ROOT, ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "1 kept, 0 broken" in p.stdout


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (pip install -e '.[dev]')")
def test_the_layers_contract_can_break(tmp_path):
    # The same contract on a copy of two layers, where the machine imports the model: refused.
    pkg = tmp_path / "tuna_lab"
    for sub in ("machine", "model"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "machine" / "topology.py").write_text("def f():\n    from ..model import tuna\n")
    (pkg / "model" / "tuna.py").write_text("from ..machine import topology\n")
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\nroot_package = tuna_lab\n\n[importlinter:contract:layers]\nname = layers\n"
        "type = layers\nlayers =\n    tuna_lab.model\n    tuna_lab.machine\n")
    p = lint_imports(tmp_path, tmp_path)
    assert p.returncode != 0 and "tuna_lab.machine is not allowed to import tuna_lab.model" in p.stdout


# The one layer that reads the OS: these are the modules that name a /proc or /sys path.
OS_LAYER = "tuna_lab/machine/"
# _files is the safe reader itself (its examples and checks name /proc).
OS_PATH_ALLOWED = {"tuna_lab/_files.py"}


def os_paths(path):
    """The ``/proc``/``/sys`` paths a module names in its code (strings and f-strings; docstrings left out)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            text = node.values[0].value
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
        else:
            continue
        if isinstance(text, str) and text.startswith(("/proc", "/sys/")):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text}")
    return sorted(set(found))      # an f-string's first part is also a constant of its own


def test_only_the_machine_package_opens_proc_and_sys():
    outside = [hit for path in sorted((ROOT / "tuna_lab").rglob("*.py"))
               if not str(path.relative_to(ROOT)).startswith(OS_LAYER)
               and str(path.relative_to(ROOT)) not in OS_PATH_ALLOWED
               for hit in os_paths(path)]
    assert not outside, "read /proc and /sys through tuna_lab.machine (procfs, sched, irqs...):\n" + "\n".join(outside)
