"""Write docs/api/*.rst and the API part of docs/_toc.yml from the package itself.

One page per public module (a module with an ``__all__``), in the order of the
stages (:data:`STAGES`). A name a module defines gets its own directive; a name
it only re-exports (a package's lazy namespace) is listed under "Re-exported
here" and links to the module that defines it. Run it after adding or moving a
module (``make api-docs``); tests/test_docs.py fails while a page is missing or
stale.

    python docs/_ext/api_pages.py
"""

import importlib
import importlib.util
import inspect
import pkgutil
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "api"
TOC = ROOT / "docs" / "_toc.yml"
FAMILIES = ROOT / "docs" / "families"

#: Packages in data-flow order: the arrows of the layout point from later to earlier.
STAGES = ("tuna_lab", "tuna_lab.errors", "tuna_lab.machine", "tuna_lab.model", "tuna_lab.placement",
          "tuna_lab.server", "tuna_lab.integrations", "tuna_lab.measure", "tuna_lab.analysis",
          "tuna_lab.widgets", "tuna_lab.cli")


def public_modules():
    """Every importable public module of tuna_lab, in stage order, then by name."""
    import tuna_lab

    names = ["tuna_lab"]
    for info in pkgutil.walk_packages(tuna_lab.__path__, "tuna_lab."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)

    def rank(name):
        stage = max((s for s in STAGES if name == s or name.startswith(s + ".")), key=len, default="")
        return (STAGES.index(stage) if stage in STAGES else len(STAGES), name.count(".") > stage.count("."), name)

    return sorted(names, key=rank)


def _directive(obj):
    if inspect.isclass(obj):
        return "autoexception" if issubclass(obj, BaseException) else "autoclass"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return "autofunction"
    return "autodata"


def _declares_all(name):
    """Whether the module's source assigns ``__all__`` (read, not imported: some modules are
    configuration files that need their process's environment)."""
    import ast

    spec = importlib.util.find_spec(name)
    tree = ast.parse(Path(spec.origin).read_text())
    return any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
               for node in tree.body)


def family_classes():
    """The names of the constraint families that docs/families/*.rst describe (``.. tuna-family:: Name``).

    Each is described there, whole; the API page of its module lists it and links to that
    description, but does not describe it a second time (Sphinx would warn of a duplicate
    object description for the class and each of its members).
    """
    return {cls for path in FAMILIES.glob("*.rst")
            for cls in re.findall(r"^\.\. tuna-family::\s+(\w+)\s*$", path.read_text(), re.M)}


def page(name):
    """The reST of one module's page, or None for a module without ``__all__``."""
    if not _declares_all(name):
        return None
    module = importlib.import_module(name)
    public = module.__all__
    own, reexported = [], []
    package = module.__file__.endswith("__init__.py")
    for attr in public:
        obj = getattr(module, attr)
        # A package's namespace re-exports its submodules' names; a module re-exports
        # the classes and functions whose home is elsewhere.
        own_module = getattr(obj, "__module__", name) if inspect.isclass(obj) or inspect.isfunction(obj) else None
        # A class or function is documented where it is defined, also when another module re-exports it.
        if package:
            home = own_module if _is_public_submodule(own_module, "tuna_lab") else _defined_in_submodule(module, attr)
        else:
            home = own_module or name
        (own if home in (name, None) else reexported).append((attr, obj, home))
    families = family_classes()
    elsewhere = [a for a, obj, _ in own if a in families and getattr(obj, "__module__", None) == name]
    described = [entry for entry in own if entry[0] not in elsewhere]
    lines = [name, "=" * len(name), "", f".. automodule:: {name}", ""]
    if described:
        lines += [".. autosummary::", "   :nosignatures:", ""] + [f"   {a}" for a, _, _ in described] + [""]
    if elsewhere:
        # autosummary links each name to its description, which is on the family's page
        lines += [".. rubric:: The constraint families", "",
                  "Each family is described on its own page (:doc:`../families/index`), generated from its class.",
                  "", ".. autosummary::", "   :nosignatures:", ""]
        lines += [f"   {a}" for a in elsewhere] + [""]
    if reexported:
        lines += [".. rubric:: Re-exported here", "", ".. autosummary::", "   :nosignatures:", ""]
        lines += [f"   ~{home.removeprefix(name + '.')}.{a}" if home.startswith(name + ".") else f"   ~{home}.{a}"
                  for a, _, home in reexported] + [""]
    for attr, obj, _ in described:
        directive = _directive(obj)
        lines.append(f".. {directive}:: {attr}")
        if directive == "autoclass":
            lines += ["   :members:", "   :show-inheritance:"]
            if any(b.__module__.startswith("tuna_lab") and b is not obj for b in obj.__mro__[1:]):
                lines.append("   :inherited-members:")
        lines.append("")
    subs = [m for m in public_modules() if m.rsplit(".", 1)[0] == name and m != name and _declares_all(m)]
    if subs:
        lines += ["Its modules:", "", ".. autosummary::", ""] + [f"   {m.rsplit('.', 1)[1]}" for m in subs] + [""]
    return "\n".join(lines).rstrip() + "\n"


def _is_public_submodule(module, package):
    """Whether ``module`` lies inside ``package`` and no part of its name is private."""
    return bool(module) and module.startswith(package + ".") and not any(
        part.startswith("_") for part in module.split("."))


def _defined_in_submodule(package, attr):
    """The submodule of ``package`` whose own ``__all__`` holds ``attr`` (None if none does)."""
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        if info.name.rsplit(".", 1)[1].startswith("_"):
            continue
        sub = importlib.import_module(info.name)
        if attr in getattr(sub, "__all__", ()):
            return (_defined_in_submodule(sub, attr) or info.name) if hasattr(sub, "__path__") else info.name
    return None


def main():
    sys.path.insert(0, str(ROOT))
    written = []
    for name in public_modules():
        text = page(name)
        if text is None:
            continue
        (API / f"{name}.rst").write_text(text)
        written.append(name)
    for stale in API.glob("*.rst"):
        if stale.stem not in written:
            stale.unlink()
    toc = TOC.read_text()
    entries = "".join(f"          - file: api/{n}\n" for n in written)
    toc = re.sub(r"(      - file: api/index\n        sections:\n)(?:          - file: api/.*\n)+",
                 lambda m: m.group(1) + entries, toc)
    TOC.write_text(toc)
    print(f"wrote {len(written)} API pages")


if __name__ == "__main__":
    main()
