"""``tuna-lab``'s start: a command imports its own module only, and the help still lists every command.

The import probes are fresh interpreters that run ``tuna_lab.cli.main`` (the ``tuna-lab``
entry point) and print ``sys.modules``: this test process has long since imported everything.
(``-X importtime`` would not do: it does not see the modules ``main`` imports by name.)
"""

import argparse
import json
import os
import subprocess
import sys

import pytest

from helpers import cli
from helpers import main as run
from tuna_lab.cli import build_parser
from tuna_lab.cli.commands import COMMANDS

#: What `tuna-lab topology` must not pay for: the lab server, the measurement, the analysis, the solver.
NOT_FOR_TOPOLOGY = ("tuna_lab.server", "tuna_lab.measure", "pandas", "cvxpy")

_MARK = "SYS-MODULES:"


def imported(*args):
    """``(process, modules)``: ``tuna-lab ARGS`` run by ``main`` in a fresh interpreter, and what it imported.

    The modules are those in ``sys.modules`` once ``main`` has returned or
    exited (argparse's ``--help`` and usage errors exit); ``returncode`` is its status.
    """
    code = (f"import json, sys\nfrom tuna_lab.cli import main\n"
            f"try:\n    status = main({list(args)!r})\nexcept SystemExit as exc:\n    status = exc.code\n"
            f"print({_MARK!r} + json.dumps(sorted(sys.modules)))\nsys.exit(status)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = p.stdout.splitlines()
    modules = [line for line in lines if line.startswith(_MARK)]
    assert modules, p.stderr
    p.stdout = "".join(f"{line}\n" for line in lines if not line.startswith(_MARK))
    return p, set(json.loads(modules[-1].removeprefix(_MARK)))


def under(modules, package):
    """The modules of ``modules`` that are ``package`` or inside it, sorted."""
    return sorted(m for m in modules if m == package or m.startswith(package + "."))


def commands_of(parser):
    """``{name: parser}`` of a ``tuna-lab`` parser's commands."""
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_topology_imports_its_own_module_and_not_what_it_does_not_use():
    p, modules = imported("topology", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["logical_cores"]
    assert under(modules, "tuna_lab.cli") == ["tuna_lab.cli", "tuna_lab.cli.commands",
                                              "tuna_lab.cli.commands.topology", "tuna_lab.cli.options"]
    assert [m for package in NOT_FOR_TOPOLOGY for m in under(modules, package)] == []
    # This machine is read from sysfs: the hwloc XML reader is for --hwloc-xml.
    assert "tuna_lab.machine.readers.hwloc_xml" not in modules


def test_the_probe_sees_a_command_module_and_the_server_when_they_are_used():
    # If this passes, a clean result above means "not imported", not "the probe is blind".
    p, modules = imported("status", "--pidfile", "/nonexistent")
    assert p.returncode == 2 and "no running tuna-lab server" in p.stderr
    assert "tuna_lab.cli.commands.serve" in modules and "tuna_lab.server.launch" in modules
    assert under(modules, "tuna_lab.cli") == ["tuna_lab.cli", "tuna_lab.cli.commands",
                                              "tuna_lab.cli.commands.serve", "tuna_lab.cli.options",
                                              "tuna_lab.cli.server_options"]


@pytest.mark.parametrize("args, status", [(("--help",), 0), (("--version",), 0), (("frobnicate",), 2), ((), 2)])
def test_no_command_run_imports_no_command_module(args, status):
    p, modules = imported(*args)
    assert p.returncode == status, p.stderr
    assert under(modules, "tuna_lab.cli") == ["tuna_lab.cli", "tuna_lab.cli.commands"]


def test_help_lists_every_command_of_build_parser_with_its_help(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    p = cli("--help", env={**os.environ, "COLUMNS": "100"})
    assert p.returncode == 0, p.stderr
    full = build_parser()
    assert list(commands_of(full)) == list(COMMANDS)
    # The same text as the parser with every command built: the list, each help, the epilog.
    assert p.stdout == full.format_help()
    for name in COMMANDS:
        assert f"\n    {name} " in p.stdout


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_command_s_help_is_the_one_build_parser_builds(name, monkeypatch):
    # main() builds only this command's parser: its help must be the one of the whole parser (and the docs).
    monkeypatch.setenv("COLUMNS", "100")
    r = run(name, "--help", env={**os.environ, "COLUMNS": "100"})
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout == commands_of(build_parser())[name].format_help()


@pytest.mark.parametrize("args, error", [
    ((), "the following arguments are required: COMMAND"),
    (("frobnicate", "--json"),
     "argument COMMAND: invalid choice: 'frobnicate' (choose from " + ", ".join(map(repr, COMMANDS)) + ")"),
])
def test_no_command_or_an_unknown_one_is_one_line(args, error):
    r = run(*args)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"tuna-lab: error: {error}\n")
