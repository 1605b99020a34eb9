"""One name per idea on the command line (issue 49), held for every command's parser, built in process.

* ``-w/--workers`` is a worker count wherever it is an option; a list of
  worker PIDs is ``--worker-pids`` wherever a command takes one, and
  ``--workers`` where it used to be that list (``pin``, ``unpin``,
  ``status``, ``audit``) is refused in one line, exit 2, pointing to it.
* Every command and sub-command has a one-paragraph description.
* No ``--help`` is over 80 lines at 80 columns (what a pipe or a plain
  terminal gets); every option's help is one or two lines there.
* A default is written one way: ``(default: X)``, once, at the end of the help.

No server starts: the parsers are walked, and the refusals run the CLI in
process (one case as a process, as a user meets it).
"""

import argparse
import re
import textwrap

import pytest

from helpers import cli
from helpers import main as run

#: The commands whose ``--workers`` was a list of worker PIDs until it was renamed ``--worker-pids``.
RENAMED = ("pin", "unpin", "status", "audit")
#: Every command that names a running server's workers by their PIDs.
TAKE_PIDS = ("plan", *RENAMED)
#: The widest a help line may be drawn: argparse's help column at 80 columns (78 - the 24 of the options).
HELP_WIDTH = 54


def _parsers():
    """``{"tuna-lab run": parser, "tuna-lab bench load": parser, ...}``: every command, sub-commands included."""
    from tuna_lab.cli import build_parser

    found = {}

    def walk(name, parser):
        found[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, subparser in action.choices.items():
                    walk(f"{name} {sub}", subparser)

    walk("tuna-lab", build_parser())
    return found


PARSERS = _parsers()
COMMANDS = {name: p for name, p in PARSERS.items() if name != "tuna-lab"}


def _options(parser):
    """The options a user sees in ``parser``'s help (neither ``-h`` nor one hidden)."""
    return [a for a in parser._actions
            if a.option_strings and a.help is not argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]


def _help_text(parser, action):
    """``action``'s help as ``--help`` shows it (``%(default)s`` and the default the formatter adds expanded)."""
    return parser._get_formatter()._expand_help(action)


def test_the_walk_finds_every_command_and_benchs_sub_commands():
    names = {name.split(" ", 1)[1] for name in COMMANDS}
    assert {"plan", "pin", "unpin", "status", "serve", "stop", "audit", "run", "sweep", "solve", "tune", "report",
            "advise", "demo", "bench", "topology", "bench solver", "bench load", "bench tune"} <= names


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_command_has_a_one_paragraph_description(name):
    description = (PARSERS[name].description or "").strip()
    assert len(description.split()) >= 8, f"{name}: no description under usage: {description!r}"
    assert "\n\n" not in description, f"{name}: more than one paragraph"


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_no_help_is_over_80_lines(name, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    lines = PARSERS[name].format_help().splitlines()
    assert len(lines) <= 80, f"`{name} --help` is {len(lines)} lines"


def test_every_option_is_said_in_one_or_two_lines():
    from tuna_lab.cli.options import policy_choices

    names = ", ".join(policy_choices())
    long = []
    for name, parser in COMMANDS.items():
        for action in _options(parser):
            # The policies' list grows with those a program registers: it counts as one word.
            text = _help_text(parser, action).replace(names, "POLICIES")
            if len(textwrap.wrap(text, HELP_WIDTH, break_on_hyphens=False)) > 2:
                long.append(f"{name} {action.option_strings[-1]}: {text}")
    assert not long, "\n".join(long)


def test_workers_is_a_count_wherever_it_is_an_option():
    counts, refused = [], []
    for name, parser in COMMANDS.items():
        action = parser._option_string_actions.get("--workers")
        if action is None:
            continue
        if action.help is argparse.SUPPRESS:
            refused.append(name.split(" ", 1)[1])
            continue
        assert action.option_strings == ["-w", "--workers"] and action.dest == "workers", name
        assert action.type is int and action.metavar == "W", name
        counts.append(name.split(" ", 1)[1])
    assert {"solve", "plan", "serve", "run", "advise", "bench load"} <= set(counts)
    assert sorted(refused) == sorted(RENAMED)
    # Every command with a W takes it as -w/--workers: none spells a count another way.
    for name, parser in COMMANDS.items():
        others = [o for o in parser._option_string_actions if re.fullmatch(r"--(n-?)?workers?(-count)?", o)]
        assert set(others) <= {"--workers"}, (name, others)


def test_worker_pids_is_the_list_of_worker_pids_everywhere():
    having = []
    for name, parser in COMMANDS.items():
        action = parser._option_string_actions.get("--worker-pids")
        if action is not None:
            assert action.dest == "worker_pids" and "PID" in action.metavar, name
            having.append(name.split(" ", 1)[1])
        # No other option takes PIDs of workers.
        for a in _options(parser):
            if a is not action and (re.search(r"\bworkers?'? PIDs\b", _help_text(parser, a))
                                    or re.search(r"PIDS|PID,", str(a.metavar))):
                pytest.fail(f"{name} {a.option_strings}: a list of worker PIDs under another name")
    assert sorted(having) == sorted(TAKE_PIDS)
    args = PARSERS["tuna-lab"].parse_args(["status", "--pid", "1", "--worker-pids", "12,13"])
    assert args.worker_pids == "12,13"


#: ``(default: X)`` at the very end of a help; X may hold parentheses of its own.
_TRAILING_DEFAULT = re.compile(r" \(default: [^()]*(\([^()]*\)[^()]*)*\)$")


def test_defaults_are_written_one_way():
    odd = []
    for name, parser in COMMANDS.items():
        for action in _options(parser):
            text = _help_text(parser, action)
            end = _TRAILING_DEFAULT.search(text)
            body = text[:end.start()] if end else text
            # "default" in the rest of the text is a value in a list ("default, passive, active"), never a default.
            if re.search(r"\bdefault\b(?!,)", body, re.IGNORECASE):
                odd.append(f"{name} {action.option_strings[-1]}: {text}")
            if end is None and action.default not in (None, False, [], "", argparse.SUPPRESS) and action.nargs != 0:
                odd.append(f"{name} {action.option_strings[-1]}: default {action.default!r} not said")
    assert not odd, "\n".join(odd)
    texts = {n: p.format_help() for n, p in COMMANDS.items()}
    assert "(default: 5)" in texts["tuna-lab run"] and "(default: [])" not in "".join(texts.values())


@pytest.mark.parametrize("command", RENAMED)
@pytest.mark.parametrize("spelling", [["--workers", "12,13"], ["--workers=12"], ["--workers"]])
def test_the_old_spelling_of_worker_pids_is_refused_with_a_pointer(command, spelling):
    r = run(command, "--pid", "1", *spelling)
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0] == (f"tuna-lab {command}: error: --workers is a worker count; a list of worker PIDs is "
                        "--worker-pids (renamed in 0.1.0)"), lines[0]


def test_the_old_spelling_is_refused_by_the_installed_command_too():
    # As a user meets it: a process, whatever else the line holds (refused before --pid is looked at).
    p = cli("pin", "--workers", "4121,4122", "--pid", "1", "--dry-run", timeout=60)
    assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1 and "--worker-pids" in p.stderr, p.stderr


def test_plans_pid_list_is_worker_pids_and_its_workers_a_count():
    r = run("plan", "-w", "2", "-t", "1", "--worker-pids", "12,13", "--synthetic", "core:2 pu:1")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--worker-pids and --worker-match name the workers of --pid" in r.stderr, r.stderr
    assert "--workers" not in r.stderr
