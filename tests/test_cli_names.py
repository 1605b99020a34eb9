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
from tuna_lab.cli.options import THREADS_HELP
from tuna_lab.cli.server_options import REQUEST_HELP, worker_count_arg

#: The one line that refuses a list of worker PIDs given as -w/--workers.
POINTER = "tuna-lab: error: --workers is a worker count; a list of worker PIDs is --worker-pids (renamed in 0.1.0)"

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
        assert action.type in (int, worker_count_arg) and action.metavar == "W", name
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
    assert lines[0] == POINTER, lines[0]


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


# ------------------------------------------------------------ the audit of issue 49: bad input, one way


@pytest.mark.parametrize("argv", [["pin", "--pid", "1", "-w", "123,456"], ["unpin", "--pid", "1", "-w", "123,456"],
                                  ["status", "--pid", "1", "-w", "123,456"], ["audit", "--pid", "1", "-w", "123,456"],
                                  ["plan", "--pid", "1", "--workers", "123,456", "-t", "1"],
                                  ["plan", "--pid", "1", "-w", "123,456", "-t", "1"]])
def test_a_list_of_pids_given_as_workers_gets_the_one_pointer(argv):
    r = run(*argv)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.splitlines() == [POINTER], r.stderr


def test_no_option_is_taken_by_a_prefix_of_its_name():
    # `sweep --model small` once started a sweep of --models small.
    for name, parser in PARSERS.items():
        assert parser.allow_abbrev is False, name
    r = run("sweep", "--out", "never-made", "--model", "small")
    assert r.returncode == 2 and r.stderr == "tuna-lab: error: unrecognized arguments: --model small\n", r.stderr


@pytest.mark.parametrize("argv, line", [
    (["bench", "load", "--connections", "4"], "--connections is --concurrency (requests in flight, as in run and "
                                              "sweep), renamed in 0.1.0"),
    (["bench", "sampler", "--connections", "4"], "--connections is --concurrency"),
    (["bench", "tune", "--race-rounds", "2"], "--race-rounds is --rounds (as tune's), renamed in 0.1.0"),
    (["report", "results", "--output", "r.html"], "--output is -o/--out (the HTML file to write), renamed in 0.1.0"),
    (["advise", "--results", "res", "-w", "1", "-t", "1", "--model", "small"],
     "--results DIR is now the positional RESULTS, as in report"),
    (["unpin", "--isolation"], "--isolation is --isolate"),
])
def test_an_old_spelling_is_refused_with_a_pointer_to_the_one_name(argv, line):
    r = run(*argv)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"tuna-lab: error: {line}"), r.stderr


def test_the_one_names_parse():
    parse = PARSERS["tuna-lab"].parse_args
    assert parse(["bench", "load", "--concurrency", "4"]).connections == 4
    assert parse(["bench", "tune", "--rounds", "2"]).race_rounds == 2
    assert parse(["report", "r", "--out", "x.html"]).out == parse(["report", "r", "-o", "x.html"]).out == "x.html"
    assert parse(["advise", "res", "-w", "1", "-t", "1", "--model", "small"]).results == "res"
    assert parse(["unpin", "--isolate"]).isolation


@pytest.mark.parametrize("argv, line", [
    (["bench", "tune", "--rounds", "0", "--out", "never.csv"], "--rounds must be at least 1, got 0"),
    (["tune", "--sla-p99", "50ms", "--rounds", "0"], "--rounds must be at least 1, got 0"),
    (["tune", "--sla-p99", "50ms", "--budget", "-1m"], "--budget must be positive, got '-1m'"),
    (["tune", "--sla-p99", "-5ms"], "--sla-p99 must be positive, got '-5ms'"),
    (["sweep", "--out", "never-made", "--budget", "-1m"], "--budget must be positive, got '-1m'"),
    (["plan", "-w", "1", "-t", "1", "--front-cpus", "2-99", "--synthetic", "core:2 pu:1"],
     "--front-cpus: CPUs 2-99 are not among the server's CPUs 0-1"),
    (["plan", "-w", "1", "-t", "1", "--front-cpus", "3", "--synthetic", "core:2 pu:1"],
     "--front-cpus: CPU 3 is not one of the server's CPUs 0-1"),
])
def test_bad_values_are_said_as_such(argv, line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run(*argv)
    assert r.returncode == 2 and r.stdout == "" and r.stderr == f"tuna-lab: error: {line}\n", r.stderr


@pytest.mark.parametrize("options, line", [
    (["-t", "0", "--policy", "cfs"], "-t must be a positive integer, got 0"),
    (["--policy", "cfs"], "--policy needs -t T"),
    (["-t", "2"], "-t needs --policy POLICY"),
    (["--policy", "bogus", "-t", "2"], "unknown policy 'bogus'"),
    ([], "say what to apply: --policy POLICY -t T, or --plan FILE"),
])
def test_pin_says_what_is_wrong_with_its_options_before_it_looks_at_the_process(options, line):
    # This test's own process is no pre-fork server, and PID 1 is refused: neither is looked at first.
    import os

    for pid in (os.getpid(), 1):
        r = run("pin", "--pid", pid, "--force", *options)
        assert r.returncode == 2 and r.stdout == "", r.stderr
        assert r.stderr.startswith(f"tuna-lab: error: {line}") and r.stderr.count("\n") == 1, r.stderr


def test_every_error_starts_the_same_way():
    for argv in (["pin"], ["solve", "-w", "x", "-t", "1"], ["nope"], ["solve", "--bogus"], ["plan", "--format", "x"]):
        r = run(*argv)
        assert r.returncode == 2 and r.stderr.startswith("tuna-lab: error: ") and r.stderr.count("\n") == 1, r.stderr


#: Options that mean one thing but whose value is, by design, of two kinds (a results folder, a file).
_TWO_KINDS = {"--out", "--plan", "--model"}


def test_one_metavar_per_option():
    seen = {}
    for name, parser in COMMANDS.items():
        for action in parser._actions:
            # Every option a command takes, the hidden ones too, but the old spellings it refuses.
            if action.option_strings and action.nargs != 0 and action.dest != argparse.SUPPRESS:
                for option in action.option_strings:
                    seen.setdefault(option, {}).setdefault(str(action.metavar), []).append(name)
    odd = {o: m for o, m in seen.items() if len(m) > 1 and o not in _TWO_KINDS}
    assert not odd, odd
    # Lists of CPUs are CPULIST, comma lists of anything else LIST, seconds S.
    assert seen["--client-cpus"].keys() == seen["--front-cpus"].keys() == {"CPULIST"}
    assert seen["--step-seconds"].keys() == {"S"} and seen["--policies"].keys() == {"LIST"}
    assert seen["--batch"].keys() == {"ROWS"} and seen["--concurrency"].keys() == {"N"}


def test_threads_and_requests_are_described_one_way():
    for name, parser in COMMANDS.items():
        for action in _options(parser):
            text = _help_text(parser, action)
            if "--threads" in action.option_strings:
                assert THREADS_HELP in text, (name, text)
            for option in ("method", "header", "body", "bodies"):
                if f"--{option}" in action.option_strings:
                    assert text == REQUEST_HELP[option], (name, text)
    assert "pool threads per worker" not in "".join(p.format_help() for p in COMMANDS.values())


def test_defaults_have_no_second_form():
    odd = []
    for name, parser in PARSERS.items():
        text = " ".join(parser.format_help().split())
        for pattern in (r"\) \(default", r"\(default: -?[0-9]+\.0\)", r"\(without it", r"\(0: ",
                        r"\(default: default\)", r"\bissue [0-9]+"):
            odd += [f"{name}: {m}" for m in re.findall(f".{{30}}{pattern}.{{0,20}}", text)]
    assert not odd, "\n".join(odd)


def test_shared_blocks_are_said_once_in_the_docs():
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "cli.md").read_text()
    for heading in ("## Your own server", "## The machine"):
        assert heading in doc, heading
    for option in ("--app-dir", "--server-conf", "--python", "--server-timing", "--bodies", "--label", "--hwloc-xml",
                   "--fsroot", "--sample-hz"):
        assert f"`{option}" in doc, option
    for name in ("run", "sweep", "tune"):
        help_text = COMMANDS[f"tuna-lab {name}"].format_help()
        assert "your own server (each option: docs/cli.md" in help_text and "--app-dir DIR" in help_text
