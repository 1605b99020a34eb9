"""The house rules of docs/architecture.md, checked on the source (no server; the formats' test imports the
two light modules it compares).

* no file of ``tuna_lab/`` over 800 lines;
* every ``tuna_lab.x.y`` a docstring, comment or page of docs/ names is a module that exists (or a name one
  defines);
* no function with more than 12 parameters;
* the CLI parses and prints: no ``cli/`` module imports what reads ``/proc`` or the pin records;
* no policy decided by its name's beginning; one table of plan export formats; one definition of a valid trial.

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
LONG_FILES = {}
# Functions over MAX_PARAMETERS (``self`` not counted), with their count then: none since issue 48
# (``experiment.run`` takes LoadSpec and TrialSpec). Kept, empty, so the rule's test reads as the others.
MANY_PARAMETERS = {}


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


#: The pages a user reads name modules too: a module that moved must not leave them pointing nowhere.
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def _references():
    for path in (*SOURCES, *PAGES):
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


# -- the CLI parses and prints: it reads no /proc and no pin record ----------------------------------

#: What the CLI must not import: the one reader of /proc and the ledger's records and state folder.
#: Building a target from the options is measure's (tuna_lab.measure.target_spec.build_target).
CLI_MUST_NOT_IMPORT = ("tuna_lab.machine.procfs", "tuna_lab.live.ledger", "tuna_lab.live.state", "tuna_lab.live.pools")
# TODO (issue 48): where main's cli/ still imports one of them, with what; each may only shrink.
CLI_IMPORTS_ALLOWED = {
    # pin --watch's signal handling (signals_give_back, Signalled, FATAL_SIGNALS); it reads no record itself
    "tuna_lab/cli/commands/pin.py": {"tuna_lab.live.ledger"},
    # the command's own age, taken from its --time-limit (/proc/self)
    "tuna_lab/cli/commands/solve.py": {"tuna_lab.machine.procfs"},
}


def _module_of(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path, text=None):
    """Every module ``path`` imports, function-local imports included: ``from X import y`` gives X and X.y."""
    tree = ast.parse(path.read_text() if text is None else text)
    package = _module_of(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def _forbidden(modules):
    return {m for m in CLI_MUST_NOT_IMPORT for i in modules if i == m or i.startswith(m + ".")}


def test_the_cli_reads_no_proc_and_no_pin_record():
    found = {rel(p): _forbidden(imported_modules(p)) for p in sorted((PACKAGE / "cli").rglob("*.py"))}
    found = {p: f for p, f in found.items() if f}
    new = {p: sorted(f - CLI_IMPORTS_ALLOWED.get(p, set())) for p, f in found.items()
           if f - CLI_IMPORTS_ALLOWED.get(p, set())}
    assert not new, f"cli/ modules that import what reads /proc or the pin records (ask measure or live): {new}"
    fixed = {p: sorted(a - found.get(p, set())) for p, a in CLI_IMPORTS_ALLOWED.items() if a - found.get(p, set())}
    assert not fixed, f"no longer imported: remove from CLI_IMPORTS_ALLOWED: {fixed}"


@pytest.mark.parametrize("source, bad", [
    ("from ..live.pin import server_cpus\n", set()),
    ("def f():\n    from ..machine.procfs import process_age\n", {"tuna_lab.machine.procfs"}),
    ("from ..live import ledger\n", {"tuna_lab.live.ledger"}),
    ("import tuna_lab.live.state as s\n", {"tuna_lab.live.state"}),
])
def test_the_cli_import_check_can_fail(source, bad):
    assert _forbidden(imported_modules(PACKAGE / "cli" / "options.py", source)) == bad


# -- no policy decided by its name ---------------------------------------------------------------------

def _builtin_policies():
    """``BUILTIN_POLICIES`` of placement/names.py, read from its source."""
    for node in ast.parse((PACKAGE / "placement" / "names.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "BUILTIN_POLICIES" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("placement/names.py defines no BUILTIN_POLICIES")


def _prefixes(node):
    """The strings of ``node`` (a constant, or a tuple of them) that begin a policy's name and are not one."""
    values = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    names = _builtin_policies()
    # Three characters at least: "n" in a table's columns is no policy's name.
    return [v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)
            and len(v.value) >= 3 and any(n.startswith(v.value) and n != v.value for n in names)]


def policy_name_tests(text):
    """``[(line, what)]``: where ``text`` decides by a policy name's beginning (``startswith("tuna")``,
    ``name[:4] == "tuna"``, ``"tuna" in name``, ``name.split("-")[0] == "omp"``)."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("startswith", "removeprefix") and node.args and _prefixes(node.args[0]):
            out.append((node.lineno, f".{node.func.attr}({_prefixes(node.args[0])[0]!r})"))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            consts = [s for s in sides if _prefixes(s)]
            cut = [s for s in sides if isinstance(s, ast.Subscript)]
            if consts and (cut or any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)
                           and consts[0] is node.left):
                out.append((node.lineno, f"compares {_prefixes(consts[0])[0]!r} with a part of a name"))
    return out


def test_no_policy_is_decided_by_its_name():
    # A policy is what its registry entry says (pinned_by, needs_solver), never what its name begins with:
    # a registered "tuna-mine" is no Tuna, and "omp-spread" renamed would change nothing it does.
    found = [f"{rel(p)}:{line}: {what}" for p in SOURCES for line, what in policy_name_tests(p.read_text())]
    assert not found, "policies decided by their name's beginning (ask the registry):\n" + "\n".join(found)


@pytest.mark.parametrize("source, found", [
    ('if policy.startswith("tuna"): pass', 1),
    ('if name[:4] == "tuna": pass', 1),
    ('ok = "omp" in policy', 1),
    ('ok = policy.split("-")[0] == "omp"', 1),
    ('ok = policy.startswith(("cfs", "tuna-"))', 1),
    ('ok = policy == "tuna-scatter" or wait == "default"', 0),
    ('ok = line.startswith("tuna-lab-check ")', 0),
])
def test_the_policy_name_check_can_fail(source, found):
    assert len(policy_name_tests(source)) == found


# -- one table of export formats -----------------------------------------------------------------------

def _formats():
    for node in ast.parse((PACKAGE / "placement" / "names.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FORMATS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("placement/names.py defines no FORMATS")


def test_one_table_of_plan_formats():
    # The table is placement/names.FORMATS; placement/plan renders it and `plan --format` offers it: the
    # same object, so that a format added there is offered and rendered everywhere, and no copy drifts.
    from tuna_lab.cli.commands import plan as plan_command
    from tuna_lab.placement import names, plan

    assert plan.FORMATS is names.FORMATS and plan_command.FORMATS is names.FORMATS
    parser = __import__("argparse").ArgumentParser()
    sub = parser.add_subparsers()
    plan_command.add_parser(sub)
    (choices,) = [a.choices for a in sub.choices["plan"]._actions if "--format" in a.option_strings]
    assert choices is names.FORMATS
    formats = set(_formats())
    copies = [f"{rel(p)}:{node.lineno}" for p in SOURCES if p != PACKAGE / "placement" / "names.py"
              for node in ast.walk(ast.parse(p.read_text()))
              if isinstance(node, (ast.Tuple, ast.List, ast.Set))
              # every format, or all but the newest: a copy (a test of a few, `kind in ("env", ...)`, is not)
              and len({e.value for e in node.elts if isinstance(e, ast.Constant)} & formats) >= len(formats) - 1]
    assert not copies, f"copies of placement/names.FORMATS (import it): {copies}"


# -- one definition of a valid trial -------------------------------------------------------------------

def _definitions(name):
    return [f"{rel(p)}:{scope + '.' if scope else ''}{node.name}" for p in SOURCES
            for scope, node in _functions(ast.parse(p.read_text())) if node.name == name]


def _calls(path, function, callee):
    """Whether ``function`` of module ``path`` calls ``callee`` (by name or attribute)."""
    for scope, node in _functions(ast.parse(path.read_text())):
        if node.name == function:
            return any(isinstance(c, ast.Call)
                       and callee in (getattr(c.func, "id", None), getattr(c.func, "attr", None))
                       for c in ast.walk(node))
    return False


def test_one_definition_of_a_valid_trial():
    # measure/store.valid_rows is the rule; everything else that says which trials are valid asks it.
    assert _definitions("valid_rows") == ["tuna_lab/measure/store.py:valid_rows"]
    defined = _definitions("valid_trials")
    assert len(defined) <= 1, f"more than one valid_trials (one name, one meaning): {defined}"
    for where in defined:
        path, function = where.split(":")
        assert _calls(ROOT / path, function, "valid_rows"), f"{where} does not ask valid_rows"


def test_every_entry_of_the_whole_experiment_lane_names_a_test_that_exists():
    # A misspelt entry would leave a slow test in `make test` unseen: each must name a file and a function.
    # Read, not imported: importing the root conftest again would install its fast-lane hooks twice.
    root = Path(__file__).resolve().parents[1]
    tables = {node.targets[0].id: ast.literal_eval(node.value.args[0])
              for node in ast.parse((root / "conftest.py").read_text()).body
              if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in ("E2E_FILES", "E2E_TESTS")}
    assert tables["E2E_FILES"] and tables["E2E_TESTS"]
    for path in tables["E2E_FILES"]:
        assert (root / path).is_file(), path
    for entry in tables["E2E_TESTS"]:
        path, _, name = entry.partition("::")
        assert re.search(rf"^def {re.escape(name)}\(", (root / path).read_text(), re.M), entry
