"""Hostile names in every export: nothing ``tuna-lab plan`` prints runs what the user did not write.

A machine's name is its file's name (``--hwloc-xml F``), and a plan read
from a file or made by a program can name anything. Each name below is one
a local user can give a file: a newline and then a line of Python or shell,
``$(...)``, backticks, ``;``, quotes, a carriage return, control and
line-separator characters, bytes that are not UTF-8, and a PEP 263 coding
declaration that would make Python read ``+AAo-`` as a newline. Every
payload would create a file in the current folder. For each format:

* ``gunicorn``: the snippet compiles, and executing it (as Gunicorn does a
  config file, in an empty folder) creates no file; the plan it sets names
  the machine by its real name;
* ``taskset`` and ``env``: ``sh -n`` accepts them and ``sh`` runs them in an
  empty folder without creating a file;
* ``env``, ``omp-places``, ``onnxruntime``: every line is a comment or one
  value (one assignment, one slot), as many as the plan has;
* ``json``: it reads back to the name.

The CLI runs in this process (helpers.main); what it prints is checked as
text that a terminal (UTF-8) can show, so a name that is not UTF-8 cannot end
the command in an encoding error either.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import main
from tuna_lab.cli import build_parser
from tuna_lab.placement import names
from tuna_lab.placement.plan import FORMATS, Plan, parse_omp_places

XML = Path(__file__).parent / "data" / "v2_linux_smt.xml"
W, T = 2, 2

#: Names a local user can give a file; each payload would create a file named pwned* in the working folder.
NAMES = {
    "python-line": 'x.xml\nimport os; os.system("id > pwned-py.txt")\n#',
    "shell-line": "x.xml\ntouch pwned-sh\n#",
    "subst": "$(touch pwned-subst).xml",
    "backticks": "`touch pwned-tick`.xml",
    "semicolon": "a;touch pwned-semi;.xml",
    "quotes": "q'\"; touch pwned-quote; echo '\".xml",
    "carriage-return": "cr\rtouch pwned-cr\r.xml",
    # bytes that are not UTF-8 (a surrogate here), an escape sequence, U+2028 and NEL: lines to splitlines()
    "control": os.fsdecode(b"bad-\xff-") + "\x1b[2J-\u2028-\x85-\x0b-\x0c.xml",
    # Python reads lines 1-2 for a coding declaration; in UTF-7, +ACc- is ' and +AAo- a newline.
    "utf-7": "coding:utf-7 +ACc-+AAo-open(+ACc-pwned-utf7+ACc-,+ACc-w+ACc-)+AAo-#.xml",
}

#: One line of the env format: NAME=VALUE, the value one shell word.
_ENV_LINE = re.compile(r"[A-Z_]+=\S.*")
_OMP_LINE = re.compile(r'slot (\d+): OMP_PLACES="([^"]*)" OMP_PROC_BIND=close OMP_NUM_THREADS=(\d+)')
_ORT_LINE = re.compile(r"slot (\d+): intra_op_num_threads=(\d+) session.intra_op_thread_affinities=(\S*)")


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """``{(case, format): output}``: ``tuna-lab plan --hwloc-xml NAME --format FORMAT`` for every name."""
    folder = tmp_path_factory.mktemp("names")
    out = {}
    for case, name in NAMES.items():
        path = folder / name
        shutil.copyfile(XML, path)
        for fmt in FORMATS:
            done = main("plan", "-w", W, "-t", T, "--policy", "round-robin", "--hwloc-xml", path, "--format", fmt,
                        cwd=folder)
            assert done.returncode == 0, (case, fmt, done.stderr)
            assert "Traceback" not in done.stderr
            out[case, fmt] = done.stdout
    assert sorted(p.name for p in folder.iterdir()) == sorted(NAMES.values())   # the CLI itself made nothing
    return out


def _lines(text):
    """The lines of a command's output (its one final newline is not a line of its own)."""
    return text.removesuffix("\n").split("\n")


def _printable(text):
    """Every line is text a UTF-8 terminal shows as written: no control character, nothing that is not UTF-8."""
    text.encode("utf-8")                                # a lone surrogate would raise here, as print() would
    return all(line.isprintable() for line in _lines(text))


@pytest.mark.parametrize("case", list(NAMES))
def test_every_format_is_printable_text_whose_lines_are_the_plan_s(case, exports):
    for fmt in FORMATS:
        assert _printable(exports[case, fmt]), (case, fmt, exports[case, fmt])
    # json: the real name, escaped by JSON
    assert json.loads(exports[case, "json"])["topology"]["name"] == NAMES[case]
    # env: comments and one NAME=VALUE word per line, five a slot (GOMP_CPU_AFFINITY too: one CPU a thread)
    values = [line for line in _lines(exports[case, "env"]) if not line.startswith("#")]
    assert all(_ENV_LINE.fullmatch(line) and len(shlex.split(line)) == 1 for line in values), values
    assert len(values) == W * 5
    # omp-places and onnxruntime: comments and one line a slot, in slot order
    for fmt, pattern in (("omp-places", _OMP_LINE), ("onnxruntime", _ORT_LINE)):
        rows = [line for line in _lines(exports[case, fmt]) if not line.startswith("#")]
        matches = [pattern.fullmatch(line) for line in rows]
        assert all(matches) and [int(m.group(1)) for m in matches] == list(range(W)), (fmt, rows)
    assert [parse_omp_places(m.group(2)) for m in map(_OMP_LINE.fullmatch, _lines(exports[case, "omp-places"])[-W:])] == [[(0,), (1,)], [(2,), (3,)]]


_RUN_SNIPPETS = """
import json, os, sys
result = {}
for case, (snippet, folder) in json.load(sys.stdin).items():
    os.chdir(folder)
    os.environ.pop("TUNA_LAB_PLAN", None)
    config = {}
    exec(compile(snippet, "gunicorn.conf.py", "exec"), config)
    result[case] = {"plan": os.environ["TUNA_LAB_PLAN"], "worker_class": config.get("worker_class"),
                    "workers": config["workers"]}
print(json.dumps(result))
"""


def test_the_gunicorn_snippet_runs_no_code_of_a_name(exports, tmp_path):
    # Written to a file and read back as Gunicorn reads its config: bytes, with Python's own decoding
    # (a coding declaration on lines 1-2 would apply); each in an empty folder, where a payload would write.
    snippets = {}
    for case in NAMES:
        folder = tmp_path / case
        folder.mkdir()
        conf = tmp_path / f"{case}.conf.py"
        conf.write_text(exports[case, "gunicorn"], encoding="utf-8")
        snippets[case] = (conf.read_bytes().decode("utf-8"), str(folder))
        compile(conf.read_bytes(), str(conf), "exec")   # bytes: Python honours a coding line, as when run
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNA_LAB_")}
    done = subprocess.run([sys.executable, "-c", _RUN_SNIPPETS], input=json.dumps(snippets), capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    for case, name in NAMES.items():
        assert list((tmp_path / case).iterdir()) == [], case
        assert Plan.read(got[case]["plan"]).topology == name
        # The user's worker class is kept: the snippet sets none.
        assert (got[case]["workers"], got[case]["worker_class"]) == (W, None)
    for case in NAMES:                                  # the files as a user runs them: python FILE
        run = subprocess.run([sys.executable, str(tmp_path / f"{case}.conf.py")], cwd=tmp_path / case,
                             capture_output=True, text=True, timeout=60, env=env)
        assert run.returncode == 0, (case, run.stderr)
        assert list((tmp_path / case).iterdir()) == [], case


@pytest.mark.parametrize("fmt", ["taskset", "env"])
def test_the_shell_lines_run_no_command_of_a_name(fmt, exports, tmp_path):
    for case in NAMES:
        folder = tmp_path / case
        folder.mkdir()
        script = tmp_path / f"{case}.{fmt}.sh"
        script.write_text(exports[case, fmt] + "\n", encoding="utf-8")
        check = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, (case, check.stderr)
        # Run for real: taskset refuses the placeholder TIDs (one quoted word each) and changes nothing.
        subprocess.run(["sh", str(script)], cwd=folder, capture_output=True, timeout=30)
        assert list(folder.iterdir()) == [], (case, exports[case, fmt])
    if fmt == "taskset":
        lines = [line for line in _lines(exports["subst", fmt]) if not line.startswith("#")]
        assert lines[0] == "taskset -p -c 0-1 '<TID of slot 0 rank 0>'"


# -- the library: every name a Plan holds, and every thread field ---------------------------------------

def _hostile_plan(name):
    return Plan(name, 1, 2, [[[0], [1]]], [0, 1], fingerprint=name, topology=name)


@pytest.mark.parametrize("case", list(NAMES))
def test_a_plan_s_own_names_stay_in_their_comments(case):
    # A plan from a file or a program: policy, fingerprint and machine name are anybody's text.
    plan = _hostile_plan(NAMES[case])
    for fmt in FORMATS:
        text = plan.render(fmt)
        assert _printable(text), (fmt, text)
        code = [line for line in _lines(text) if line and not line.startswith("#")]
        assert all("pwned" not in line for line in code if fmt != "json" and "TUNA_LAB_PLAN" not in line), code
    threads = [{"slot": 0, "rank": 0, "tid": f"1; touch pwned-tid {case}", "pid": NAMES[case], "exact_main": True,
                "main_note": f"x: {NAMES[case]}"},
               {"slot": 0, "rank": 1, "tid": "$(touch pwned-tid2)"}]
    text = plan.render("taskset", tids=threads)
    assert _printable(text)
    body = [shlex.split(line) for line in _lines(text) if not line.startswith("#")]
    assert [words[-1] for words in body] == [threads[0]["tid"], threads[1]["tid"]]    # one word each
    assert all(words[:3] == ["taskset", "-p", "-c"] and len(words) == 5 for words in body)


@pytest.mark.parametrize("worker_class", ["sync\nimport os", "g'thread", "x; y", "", "gthread "])
def test_a_worker_class_that_is_not_a_name_is_refused(worker_class):
    done = main("plan", "-w", 1, "-t", 1, "--policy", "round-robin", "--preset", "xeon-8272cl", "--format",
                "gunicorn", "--worker-class", worker_class)
    assert (done.returncode, done.stdout) == (2, "")
    assert len(done.stderr.strip().split("\n")) == 1 and "worker class" in done.stderr, done.stderr


def test_the_cli_offers_the_one_table_of_formats():
    # Issue 48: one table. The CLI's --format choices are the library's FORMATS itself, not a copy.
    parser = build_parser()
    sub = [a for a in parser._actions if a.dest == "command"][0]
    (fmt,) = [a for a in sub.choices["plan"]._actions if a.dest == "format"]
    assert fmt.choices is FORMATS is names.FORMATS
    source = Path(sys.modules["tuna_lab.cli.commands.plan"].__file__).read_text()
    assert '"omp-places"' not in source                 # no second spelling of the table in the CLI
