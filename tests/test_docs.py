"""The documentation sources in docs/ cover the library (cheap: no docs build; one import, of the policies).

`make docs` builds the site with Jupyter Book; these tests check, from the sources
alone, what a build would not notice by itself: a new constraint family without a
page, a name added to a module's ``__all__`` but missing from the API reference, a
page left out of the table of contents, a notebook set to execute at build time.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PKG = ROOT / "tuna_lab"

SOURCE_SUFFIXES = (".md", ".rst", ".ipynb")
# Directives that document (or summarise) a Python object in the API pages.
AUTO_DIRECTIVE = re.compile(r"^\.\. auto(?:class|function|data|exception|attribute|method)::\s+(\S+)", re.M)


def toc_files():
    """Every ``file:`` (and the ``root:``) of docs/_toc.yml, without suffix."""
    text = (DOCS / "_toc.yml").read_text()
    entries = re.findall(r"^\s*(?:-\s*)?(?:file|root):\s*(\S+)\s*$", text, re.M)
    assert entries, "no file entries found in docs/_toc.yml"
    return [e.strip("'\"") for e in entries]


def source_of(entry):
    """The existing source file of a toc entry, or None."""
    for suffix in ("", *SOURCE_SUFFIXES):
        path = DOCS / (entry + suffix)
        if path.is_file() and path.suffix in SOURCE_SUFFIXES:
            return path
    return None


def literal_assignment(tree, name):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return node.value
    return None


def public_modules():
    """``{module name: __all__}`` of every public module that declares a literal ``__all__``."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts):
            continue
        value = literal_assignment(ast.parse(path.read_text()), "__all__")
        if value is None:
            continue
        out[".".join(parts)] = list(ast.literal_eval(value))
    return out


def documented_names(rst):
    """Last dotted component of every auto* directive argument and autosummary entry."""
    names = {m.split(".")[-1] for m in AUTO_DIRECTIVE.findall(rst)}
    for block in re.findall(r"^\.\. autosummary::\n((?:[ \t]+.*\n|[ \t]*\n)*)", rst + "\n", re.M):
        for line in block.splitlines():
            line = line.strip()
            if line and not line.startswith(":"):
                names.add(line.lstrip("~").split(".")[-1])
    return names


def family_names():
    """Class names in ``FAMILY_TYPES`` of tuna_lab/model/families.py (read, not imported)."""
    value = literal_assignment(ast.parse((PKG / "model" / "families.py").read_text()), "FAMILY_TYPES")
    assert isinstance(value, ast.Tuple), "FAMILY_TYPES is no longer a literal tuple of class names"
    return [elt.id for elt in value.elts]


def test_every_toc_entry_has_a_source():
    missing = [e for e in toc_files() if source_of(e) is None]
    assert not missing, f"docs/_toc.yml names pages that do not exist: {missing}"


def test_toc_lists_each_page_once():
    entries = toc_files()
    assert len(entries) == len(set(entries)), sorted({e for e in entries if entries.count(e) > 1})


def test_existing_docs_and_notebooks_are_in_the_toc():
    entries = set(toc_files())
    pages = [p.stem for p in DOCS.glob("*.md")]
    notebooks = [f"notebooks/{p.stem}" for p in (ROOT / "notebooks").glob("*.ipynb")]
    assert {"experiment", "server", "server-models", "model", "solver-bench"} <= set(pages)
    missing = [p for p in pages + notebooks if p not in entries]
    assert not missing, f"pages not in docs/_toc.yml: {missing}"


def test_every_family_has_a_page_in_the_toc():
    entries = set(toc_files())
    pages = {}
    for path in (DOCS / "families").glob("*.rst"):
        for name in re.findall(r"^\.\. tuna-family::\s+(\w+)\s*$", path.read_text(), re.M):
            pages.setdefault(name, []).append(path)
    families = family_names()
    assert families
    missing = [f for f in families if f not in pages]
    assert not missing, f"families without a docs/families/*.rst page (`.. tuna-family:: Name`): {missing}"
    stale = sorted(set(pages) - set(families))
    assert not stale, f"family pages for classes not in FAMILY_TYPES: {stale}"
    twice = {f: p for f, p in pages.items() if len(p) > 1}
    assert not twice, twice
    off_toc = [str(p[0].relative_to(DOCS)) for p in pages.values()
               if str(p[0].relative_to(DOCS).with_suffix("")) not in entries]
    assert not off_toc, f"family pages not in docs/_toc.yml: {off_toc}"


def test_api_reference_documents_every_public_name():
    entries = set(toc_files())
    problems = []
    for module, names in public_modules().items():
        page = DOCS / "api" / f"{module}.rst"
        if not page.is_file():
            problems.append(f"{module}: no page docs/api/{module}.rst")
            continue
        if f"api/{module}" not in entries:
            problems.append(f"{module}: docs/api/{module}.rst is not in docs/_toc.yml")
        rst = page.read_text()
        if not re.search(rf"^\.\. automodule::\s+{re.escape(module)}\s*$", rst, re.M):
            problems.append(f"{module}: its page has no `.. automodule:: {module}`")
        missing = [n for n in names if n not in documented_names(rst)]
        if missing:
            problems.append(f"{module}: __all__ names missing from docs/api/{module}.rst: {missing}")
    assert not problems, "\n".join(problems)


def test_api_pages_are_of_existing_modules():
    modules = public_modules()
    assert "tuna_lab" in modules and "tuna_lab.model.families" in modules
    stale = [p.stem for p in (DOCS / "api").glob("*.rst") if p.stem not in modules]
    assert not stale, f"API pages of modules that are gone (or lost __all__): {stale}"


@pytest.mark.parametrize("setting, pattern", [
    ("notebooks are never executed by the docs build", r"^\s*execute_notebooks:\s*[\"']?off[\"']?\s*$"),
    ("no intersphinx inventory is fetched", r"^\s*intersphinx_mapping:\s*\{\}\s*$"),
])
def test_build_config_stays_offline(setting, pattern):
    assert re.search(pattern, (DOCS / "_config.yml").read_text(), re.M), setting


def test_documented_names_parser():
    rst = (".. autoclass:: Topology\n   :members:\n\n"
           ".. autosummary::\n   :nosignatures:\n\n   ~tuna.solve\n   PRESETS\n\nText\n")
    assert documented_names(rst) == {"Topology", "solve", "PRESETS"}


def test_the_policies_table_is_the_registry():
    # The one import of this file: the table must say what the registered policies are, word for word.
    from tuna_lab.placement.policies import POLICIES, get_policy

    who = {"none": "nobody", "tuna_lab": "tuna_lab", "openmp": "the OpenMP runtime"}
    rows = [f"| `{p.name}` | {p.description} | {who[p.pinned_by.value]} |" for p in map(get_policy, POLICIES)]
    table = "\n".join(["| policy | placement | pinned by |", "|---|---|---|", *rows])
    assert table in (DOCS / "concepts" / "policies.md").read_text(), table
