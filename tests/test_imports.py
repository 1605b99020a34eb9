"""What importing tuna_lab loads, and which names its modules take from each other.

The import probes run in a fresh interpreter each: the test process has long
since imported everything, so only a new one shows what an import costs.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tuna_lab

PACKAGE = Path(tuna_lab.__file__).resolve().parent

#: What a Gunicorn worker and the light commands must never load: the solver and the UI.
SOLVER_AND_UI = ("cvxpy", "highspy", "plotly", "ipywidgets")
#: What ``import tuna_lab`` must not load either.
HEAVY = SOLVER_AND_UI + ("pandas", "sklearn", "xgboost")

_MARK = "LOADED-MODULES:"


def loaded_by(code, watch=HEAVY, env=None):
    """Run ``code`` in a fresh interpreter; which of the top-level packages ``watch`` it loaded.

    ``code`` may print (a command's output); the answer is the line after it.
    ``env`` adds environment variables.
    """
    probe = (f"{code}\nimport sys\n"
             f"print({_MARK!r} + ','.join(sorted(m for m in {tuple(watch)!r} if m in sys.modules)))")
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=180,
                       env={**os.environ, **(env or {})})
    assert p.returncode == 0, p.stderr
    line = [x for x in p.stdout.splitlines() if x.startswith(_MARK)][-1]
    return {m for m in line.removeprefix(_MARK).split(",") if m}


def test_import_tuna_lab_loads_nothing_heavy():
    assert loaded_by("import tuna_lab") == set()


@pytest.mark.parametrize("module", ["tuna_lab.server.app", "tuna_lab.server.gunicorn_conf",
                                    "tuna_lab.server.wsgi"])
def test_a_server_worker_loads_no_solver_and_no_ui(module, tmp_path):
    from tuna_lab.machine import Topology
    from tuna_lab.placement import placement
    from tuna_lab.server.pinning import PLAN_FILE

    # The Gunicorn config reads the launcher's plan when imported, as in a real master.
    placement("round-robin", 2, 1, Topology.synthetic("core:2 pu:1")).plan().write(tmp_path / PLAN_FILE)
    assert loaded_by(f"import {module}", SOLVER_AND_UI, env={"TUNA_LAB_STATE": str(tmp_path)}) == set()


@pytest.mark.parametrize("argv, status", [
    (["topology", "--json"], 0),
    (["topology", "--preset", "xeon-8272cl"], 0),
    (["status", "--pidfile", "/nonexistent"], 2),
    (["stop", "--pidfile", "/nonexistent"], 2),
])
def test_light_commands_load_no_solver_and_no_ui(argv, status):
    # The exit status is checked too, so that the probe is known to have run the command.
    code = (f"from tuna_lab.cli import main\n"
            f"status = main({argv!r})\n"
            f"assert status == {status}, status")
    assert loaded_by(code, SOLVER_AND_UI) == set()


def test_the_probe_sees_the_solver_when_it_is_used():
    # If this passes, a clean result above means "not loaded", not "the probe is blind".
    code = ("from tuna_lab import solve, Topology, TunaModel, Mapping\n"
            "m = solve(2, 2, Topology.synthetic('core:4 pu:1'), prove='solver')\n"
            "assert isinstance(m, Mapping) and TunaModel is not None")
    assert {"cvxpy", "cvxpy.problems"} <= loaded_by(code, HEAVY + ("cvxpy.problems",))


def test_a_solve_the_constructive_route_proves_builds_no_cvxpy_problem():
    # Importing cvxpy and building the problem take a second or two on hundreds of cores: a solve
    # that needs no HiGHS must not pay for them (the CLI's wall time is the user's). Its programs
    # run on highspy itself, not through scipy.optimize (0.2-0.6 s more to import).
    code = ("from tuna_lab.cli import main\n"
            "status = main(['solve', '-w', '32', '-t', '16', '--mode', 'compact', '--preset', 'epyc-9654-2s',"
            " '--time-limit', '30', '--json', '--without', '8p,11p-12p'])\n"
            "assert status == 0, status")
    # (cvxpy itself is a lazy module in sys.modules from the first import of the model; its
    # submodules appear when it is really loaded)
    assert loaded_by(code, ("cvxpy.problems", "cvxpy.atoms", "scipy.optimize")) == set()


# -- no module takes another module's private name -----------------------------------------------


def _module_name(path, root):
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted, root):
    where = root.parent / Path(*dotted.split("."))
    # or a compiled one, from the C file of its name (loadgen/_engine.c: setup.py builds it, built or not yet)
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file() or where.with_suffix(".c").is_file()


def private_imports(root=PACKAGE):
    """``["module:line: from X import _name", ...]`` for every private name imported inside tuna_lab.

    A private *module* of a package (``from .. import _checks``) is meant for the
    package's own modules and is not counted; a dunder is not private.
    """
    found = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "tuna_lab":
                continue
            for alias in node.names:
                name = alias.name  # the name taken, not what it is bound to (`as _lazy`)
                if name.startswith("_") and not (name.startswith("__") and name.endswith("__")) \
                        and not _is_module(f"{target}.{name}", root):
                    found.append(f"{module}:{node.lineno}: from {target} import {name}")
    return found


def test_the_private_import_check_finds_one(tmp_path):
    # The walker itself: a relative import of a private name is found, an alias is not mistaken for one.
    pkg = tmp_path / "tuna_lab"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("import lazy_loader as _lazy\nfrom .errors import TunaError as _E\n")
    (pkg / "_checks.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from .. import _checks\nfrom ..b import _helper, public\n")
    assert private_imports(pkg) == ["tuna_lab.sub.a:2: from tuna_lab.b import _helper"]


def test_no_module_imports_another_modules_private_name():
    offenders = private_imports()
    assert not offenders, "private names imported across modules:\n" + "\n".join(offenders)


def test_every_package_name_is_what_its_all_says_not_a_submodule_of_the_same_name():
    # A package that lazily exports a function `sweep` beside a subpackage `sweep` hands out the module:
    # `from tuna_lab.measure import sweep` then gives a module, not the function.
    import importlib
    import pkgutil
    import types

    import tuna_lab

    wrong = []
    for info in pkgutil.walk_packages(tuna_lab.__path__, "tuna_lab."):
        if not info.ispkg:
            continue
        package = importlib.import_module(info.name)
        for name in getattr(package, "__all__", ()):
            if isinstance(getattr(package, name), types.ModuleType):
                wrong.append(f"{info.name}.{name}")
    assert not wrong, f"names in __all__ that give a module: {wrong}"
