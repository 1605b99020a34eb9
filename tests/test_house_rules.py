"""The house rules of docs/architecture.md, checked on the source (no import of the package, no server).

* no file of ``tuna_lab/`` over 800 lines;
* every ``tuna_lab.x.y`` a docstring or comment names is a module that exists (or a name one defines);
* no function with more than 12 parameters.

Where main breaks a rule today the exception is listed here by name, with the size it has: an entry may
shrink or go, never grow, and no new one may be added (each is a TODO: split the file, or pass a spec
object - ``TrialSpec``, ``Requests``, a server spec - where the parameters travel together).
"""

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tuna_lab"
SOURCES = sorted(PACKAGE.rglob("*.py"))

MAX_LINES = 800
MAX_PARAMETERS = 12

# TODO (issue 48): files over MAX_LINES on main, with their length then; each may only shrink.
LONG_FILES = {
    "tuna_lab/measure/sweeps/cluster.py": 812,
    "tuna_lab/model/families.py": 818,
}
# TODO (issue 48): functions over MAX_PARAMETERS (``self`` not counted), with their count then.
MANY_PARAMETERS = {
    "tuna_lab/server/launch.py:Server.__init__": 20,
    "tuna_lab/measure/tune/race.py:race": 18,
    "tuna_lab/measure/experiment.py:run": 17,
    "tuna_lab/measure/tune/tuner.py:tune": 16,
    "tuna_lab/measure/sweeps/local.py:sweep": 16,
    "tuna_lab/measure/loadgen/load.py:open_loop": 16,
    "tuna_lab/measure/loadgen/load.py:aopen_loop": 16,
    "tuna_lab/measure/loadgen/load.py:_open_plan": 15,
    "tuna_lab/model/relax.py:_relaxed_mapping": 13,
    "tuna_lab/measure/loadgen/load.py:closed_loop": 13,
    "tuna_lab/measure/loadgen/load.py:aclosed_loop": 13,
}


def rel(path):
    return path.relative_to(ROOT).as_posix()


def test_no_file_is_over_800_lines():
    long = {rel(p): len(p.read_text().splitlines()) for p in SOURCES}
    over = {p: n for p, n in long.items() if n > MAX_LINES}
    new = {p: n for p, n in over.items() if p not in LONG_FILES}
    grown = {p: (LONG_FILES[p], n) for p, n in over.items() if p in LONG_FILES and n > LONG_FILES[p]}
    assert not new, f"files over {MAX_LINES} lines (split them): {new}"
    assert not grown, f"files over {MAX_LINES} lines that grew (listed size, now): {grown}"


def test_the_exceptions_are_still_needed():
    # An exception that is fixed leaves the list, so the list only ever shrinks.
    fixed = [p for p in LONG_FILES if not (ROOT / p).exists()
             or len((ROOT / p).read_text().splitlines()) <= MAX_LINES]
    assert not fixed, f"no longer over {MAX_LINES} lines: remove from LONG_FILES: {fixed}"
    counts = _parameter_counts()
    gone = [f for f in MANY_PARAMETERS if counts.get(f, 0) <= MAX_PARAMETERS]
    assert not gone, f"no longer over {MAX_PARAMETERS} parameters: remove from MANY_PARAMETERS: {gone}"


def _parameter_counts():
    out = {}
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        for scope, node in _functions(tree):
            a = node.args
            names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)] + \
                [x.arg for x in (a.vararg, a.kwarg) if x is not None]
            if scope and names and names[0] in ("self", "cls"):
                names = names[1:]
            out[f"{rel(path)}:{scope + '.' if scope else ''}{node.name}"] = len(names)
    return out


def _functions(tree, scope=""):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield scope, node
            yield from _functions(node, f"{scope + '.' if scope else ''}{node.name}")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{scope + '.' if scope else ''}{node.name}")
        else:
            yield from _functions(node, scope)


def test_no_function_takes_more_than_12_parameters():
    counts = _parameter_counts()
    over = {f: n for f, n in counts.items() if n > MAX_PARAMETERS}
    new = {f: n for f, n in over.items() if f not in MANY_PARAMETERS}
    grown = {f: (MANY_PARAMETERS[f], n) for f, n in over.items() if f in MANY_PARAMETERS and n > MANY_PARAMETERS[f]}
    assert not new, f"functions over {MAX_PARAMETERS} parameters (pass a spec object): {new}"
    assert not grown, f"functions over {MAX_PARAMETERS} parameters that grew (listed, now): {grown}"


# -- docstrings name modules that exist --------------------------------------------------------------

# A dotted name; not a format's name (``tuna_lab.plan/1``) nor a dunder (``tuna_lab.__file__``).
_REF = re.compile(r"(?<![\w/.-])tuna_lab((?:\.(?!__)\w+)+)(?![\w/])")


def _module_path(parts):
    """The file of module ``tuna_lab.<parts>``, or None."""
    base = PACKAGE.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


@functools.lru_cache(maxsize=None)
def _parsed(path):
    text = path.read_text()
    return text, ast.parse(text)


def _defines(path, name):
    """Whether module ``path`` defines or imports ``name`` at its top level (or a lazy package names it)."""
    text, tree = _parsed(path)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(t)):
                    return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name).split(".")[0] == name for a in node.names):
                return True
    # A lazy package (lazy_loader.attach) names its attributes as strings.
    return path.name == "__init__.py" and f'"{name}"' in text


def _broken(ref):
    parts = ref.lstrip(".").split(".")
    path = _module_path([])
    for i, part in enumerate(parts):
        found = _module_path(parts[:i + 1])
        if found is not None:
            path = found
            continue
        # Not a module: a name the module above defines (its attributes after it are not checked).
        return None if _defines(path, part) else f"tuna_lab.{'.'.join(parts[:i + 1])}"
    return None


def _references():
    for path in SOURCES:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for match in _REF.finditer(line):
                yield rel(path), lineno, match.group(1)


def test_docstrings_name_modules_that_exist():
    broken = sorted({f"{path}:{lineno}: {bad}" for path, lineno, ref in _references()
                     if (bad := _broken(ref)) is not None})
    assert not broken, "names of modules (or their members) that do not exist:\n" + "\n".join(broken)


@pytest.mark.parametrize("ref, bad", [("tuna_lab.placement.pin.pin_server", "tuna_lab.placement.pin"),
                                      ("tuna_lab.live.pin.pin_server", None),
                                      ("tuna_lab.live.pin.no_such_name", "tuna_lab.live.pin.no_such_name")])
def test_the_docstring_check_can_fail(ref, bad):
    assert _broken(ref.removeprefix("tuna_lab")) == bad
