"""Sphinx extension of the tuna_lab docs: pages generated from the library at build time.

Directives (all read the installed ``tuna_lab``, so the pages cannot drift from the code):

``.. tuna-family:: ClassName``
    A whole page for one constraint family of :mod:`tuna_lab.model.families`:
    title with the article's equation numbers, description, the LaTeX the class
    carries (rendered and as source), key, kind, required families, what the
    family does on a few example instances (its ``applies`` / ``active`` /
    ``note``), the encoding hooks its ``constraints`` calls, and the class's
    own docstring and members (autodoc).

``.. tuna-family-table::``
    One row per family of ``FAMILY_TYPES``, linking to the family pages.

``.. tuna-cli::``
    ``tuna-lab --help`` and ``tuna-lab <command> --help`` for every sub-command,
    as argparse prints them.

The family pages are committed stubs (``docs/families/*.rst``, one line each);
``tests/test_docs.py`` checks that every family has one and that each is in the
table of contents.
"""

import inspect
import re

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

logger = logging.getLogger(__name__)

#: Instances on which every family page shows what the family does:
#: (label, topology spec, workers, threads). "preset:" or "synthetic:" specs.
EXAMPLES = (
    ("4 x 4 on the article's machine", "preset:xeon-8272cl", 4, 4),
    ("6 x 6 on the article's machine", "preset:xeon-8272cl", 6, 6),
    ("8 x 8 on the article's machine", "preset:xeon-8272cl", 8, 8),
    ("40 x 1 on the article's machine", "preset:xeon-8272cl", 40, 1),
    ("5 x 7 on 4 cores without SMT", "synthetic:pack:1 l3:1 core:4 pu:1", 5, 7),
)


def _families():
    from tuna_lab.model import families

    return families


def family_class(name):
    """The family class called ``name`` in ``FAMILY_TYPES``; ``KeyError`` if none is."""
    for cls in _families().FAMILY_TYPES:
        if cls.__name__ == name:
            return cls
    raise KeyError(name)


def equation_label(cls):
    """The article's equation numbers as the docs write them: ``(4)+(5)``."""
    return "+".join(f"({e})" for e in cls.equations)


def family_title(cls):
    return f"{equation_label(cls)} {cls.__name__}"


def encoding_hooks(cls):
    """``[(name, called)]``: the encoding members the family's ``constraints``/``term`` use.

    Read from the source (``enc.x(...)`` is a call, ``enc.x`` an attribute); ``enc.inst`` is left out.
    """
    hooks = {}
    for meth in ("constraints", "term"):
        fn = cls.__dict__.get(meth)
        if fn is None:
            continue
        try:
            src = inspect.getsource(fn)
        except (OSError, TypeError):
            continue
        for name, call in re.findall(r"\benc\.(\w+)\s*(\()?", src):
            if name != "inst":
                hooks[name] = hooks.get(name, False) or bool(call)
    return list(hooks.items())


def _topology(spec):
    from tuna_lab import Topology

    kind, _, arg = spec.partition(":")
    return Topology.preset(arg) if kind == "preset" else Topology.synthetic(arg)


def example_rows(cls):
    """``(label, numbers, applies, active, note)`` of the family on each of :data:`EXAMPLES`."""
    from tuna_lab.model.instance import Instance

    fam = cls()
    rows = []
    for label, spec, w, t in EXAMPLES:
        inst = Instance(w, t, _topology(spec))
        numbers = (f"C={inst.C}, P={inst.P}, WT={w * t}, L={inst.L}, U={inst.U}, r={inst.r}"
                   f"{', scenario 3' if inst.scenario3 else ''}")
        rows.append((label, numbers, fam.applies(inst), fam.active(inst), fam.note(inst)))
    return rows


def _cell(text):
    """Text safe in a list-table cell (no rST markup meaning)."""
    return text.replace("\\", "\\\\").replace("*", "\\*").replace("`", "\\`").replace("|", "\\|")


def family_rst(cls):
    """The rST of the page of family ``cls`` (list of lines)."""
    fams = _families()
    by_key = {f.key: f for f in fams.FAMILY_TYPES}
    qual = f"{cls.__module__}.{cls.__name__}"
    title = family_title(cls)
    lines = [title, "=" * len(title), "", f"*{_cell(cls.description)}.*", ""]
    lines += [
        ".. math::",
        "",
        f"   {cls.latex}",
        "",
        f":Article equations: {', '.join(f'({e})' for e in cls.equations)}",
        f":Kind: {cls.kind}" + (" (a term of the objective, maximised)" if cls.kind == "objective" else ""),
        f":Key: ``\"{cls.key}\"`` - ``TunaModel(...).without(\"{cls.key}\")`` drops it, "
        f"``tuna-lab solve --without {cls.key}`` too",
        f":Implemented by: :class:`~{qual}`",
    ]
    if cls.requires:
        reqs = ", ".join(f":doc:`{equation_label(by_key[k])} <{by_key[k].key}>`" if k in by_key else f"``{k}``"
                         for k in cls.requires)
        lines.append(f":Requires: {reqs} (a model with this family and without those is refused)")
    needed_by = [f for f in fams.FAMILY_TYPES if cls.key in f.requires]
    if needed_by:
        lines.append(":Required by: " + ", ".join(f":doc:`{equation_label(f)} <{f.key}>`" for f in needed_by))
    hooks = encoding_hooks(cls)
    if hooks:
        used = ", ".join(f":meth:`enc.{h}() <tuna_lab.model.encodings.CountEncoding.{h}>`" if called
                         else f"``enc.{h}``" for h, called in hooks)
        lines.append(f":cvxpy built from: {used} of the encoding "
                     "(:class:`~tuna_lab.model.encodings.CountEncoding` by default, "
                     ":class:`~tuna_lab.model.encodings.PairwiseEncoding` for our reading of the article's literal one)")
    lines += ["", ".. rubric:: LaTeX source", "", ".. code-block:: latex", "", f"   {cls.latex}", ""]

    lines += [
        ".. rubric:: On example instances",
        "",
        "What the family does, as :meth:`~tuna_lab.model.families.Family.note` says it "
        "(computed when these docs were built). *As written* is "
        ":meth:`~tuna_lab.model.families.Family.applies`: whether the article's form applies; "
        "*adds rows* is :meth:`~tuna_lab.model.families.Family.active`.",
        "",
        ".. list-table::",
        "   :header-rows: 1",
        "   :widths: 22 30 9 9 30",
        "",
        "   * - instance",
        "     - numbers",
        "     - as written",
        "     - adds rows",
        "     - what it does",
    ]
    for label, numbers, applies, active, note in example_rows(cls):
        lines += [
            f"   * - {_cell(label)}",
            f"     - {_cell(numbers)}",
            f"     - {'yes' if applies else 'no'}",
            f"     - {'yes' if active else 'no'}",
            f"     - {_cell(note)}",
        ]
    lines += [
        "",
        ".. rubric:: The class",
        "",
        f".. autoclass:: {qual}",
        "   :members:",
        # the class attributes are the fields at the top of the page
        "   :exclude-members: key, equations, description, latex, kind, requires",
        "   :show-inheritance:",
        "",
    ]
    return lines


def family_table_rst():
    fams = _families()
    lines = [
        ".. list-table::",
        "   :header-rows: 1",
        "   :widths: 12 10 22 10 46",
        "",
        "   * - equations",
        "     - key",
        "     - class",
        "     - kind",
        "     - what it says",
    ]
    for cls in fams.FAMILY_TYPES:
        lines += [
            f"   * - :doc:`{equation_label(cls)} <{cls.key}>`",
            f"     - ``{cls.key}``",
            f"     - :class:`~{cls.__module__}.{cls.__name__}`",
            f"     - {cls.kind}",
            f"     - {_cell(cls.description)}",
        ]
    return lines + [""]


class _RstDirective(SphinxDirective):
    """Base: parse generated rST lines in place (titles allowed)."""

    def parse_lines(self, lines):
        source = self.get_source_info()[0]
        content = StringList(lines, source=f"{source} <generated by {self.name}>")
        holder = nodes.Element()
        holder.document = self.state.document
        nested_parse_with_titles(self.state, content, holder)
        return holder.children

    def depend_on(self, module):
        path = getattr(module, "__file__", None)
        if path:
            self.env.note_dependency(path)


class FamilyDirective(_RstDirective):
    required_arguments = 1
    has_content = False

    def run(self):
        name = self.arguments[0]
        try:
            cls = family_class(name)
        except KeyError:
            raise self.error(f"tuna-family: no family {name!r} in tuna_lab.model.families.FAMILY_TYPES")
        self.depend_on(_families())
        return self.parse_lines(family_rst(cls))


class FamilyTableDirective(_RstDirective):
    has_content = False

    def run(self):
        self.depend_on(_families())
        return self.parse_lines(family_table_rst())


def cli_help_texts():
    """``[(command line, help text)]``: ``tuna-lab --help`` then each sub-command's."""
    import argparse

    from tuna_lab import cli

    parser = cli.build_parser()
    out = [("tuna-lab --help", parser.format_help())]

    def walk(prefix, parser):
        # Sub-commands' own too (`tuna-lab bench load --help`).
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    out.append((f"{prefix} {name} --help", sub.format_help()))
                    walk(f"{prefix} {name}", sub)

    walk("tuna-lab", parser)
    return out


class CliDirective(SphinxDirective):
    has_content = False

    def run(self):
        import os

        from tuna_lab import cli

        path = getattr(cli, "__file__", None)
        if path:
            self.env.note_dependency(path)
        # argparse wraps help to $COLUMNS; fix it so the page does not depend on the terminal.
        old = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = "100"
        try:
            texts = cli_help_texts()
        finally:
            if old is None:
                os.environ.pop("COLUMNS", None)
            else:
                os.environ["COLUMNS"] = old
        result = []
        for command, text in texts:
            name = "-".join(command.split()[1:-1]) or "tuna-lab"
            section = nodes.section(ids=[nodes.make_id(f"cli-{name}")], names=[nodes.fully_normalize_name(command)])
            section += nodes.title(text=command.replace(" --help", ""))
            block = nodes.literal_block(text, text)
            block["language"] = "text"
            section += block
            self.state.document.note_implicit_target(section, section)
            result.append(section)
        return result


def drop_type_docstrings(app, what, name, obj, options, lines):
    """Keep a module constant without a ``#:`` comment from showing its type's docstring.

    autodoc falls back to ``type(obj).__doc__`` for data such as ``PRESETS = {...}``,
    which would print ``dict``'s or ``tuple``'s documentation (and rST errors) under it.
    """
    if what not in ("data", "attribute") or not lines:
        return
    own = type(obj).__doc__
    # A NamedTuple's field is a descriptor whose type's __doc__ is itself a descriptor, not a string.
    if isinstance(own, str) and "\n".join(lines).strip() == inspect.cleandoc(own).strip():
        lines.clear()


def escape_leading_enumerator(app, what, name, obj, options, lines):
    """Keep a summary line such as ``(1) Every thread ...`` a sentence, not a one-item list.

    The family classes start their docstrings with the article's equation number;
    rST would read ``(1) ...`` as an enumerated list, and autosummary then finds no summary.
    """
    if lines and re.match(r"^\(\d+\)\s", lines[0]):
        lines[0] = "\\" + lines[0]


def setup(app):
    # both before napoleon (priority 500) rewrites the lines
    app.connect("autodoc-process-docstring", drop_type_docstrings, priority=400)
    app.connect("autodoc-process-docstring", escape_leading_enumerator, priority=400)
    app.add_directive("tuna-family", FamilyDirective)
    app.add_directive("tuna-family-table", FamilyTableDirective)
    app.add_directive("tuna-cli", CliDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
