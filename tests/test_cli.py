"""The command line as a user runs it: stdout/stderr and exit status.

The commands run in this process (``tuna_lab.cli.main``, helpers.main); the
real entry point's exit statuses are checked once, as a process.
"""

import json
import os

import numpy as np
import pytest

import tuna_lab
from helpers import cli
from helpers import main as run

SOLVE_FIELDS = {"workers", "threads", "mode", "logical_cores", "physical_cores", "assignment", "f_main",
                "f_mode", "objective", "status", "proven_optimal", "gap", "build_seconds", "solve_seconds"}


def test_solve_json_has_the_stable_fields_and_a_valid_mapping():
    p = run("solve", "-w", "4", "-t", "4", "--preset", "xeon-8272cl", "--mode", "compact", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert SOLVE_FIELDS <= set(out)
    assert (out["workers"], out["threads"], out["mode"]) == (4, 4, "compact")
    assert (out["logical_cores"], out["physical_cores"]) == (32, 16)
    a = np.array(out["assignment"])
    assert a.shape == (4, 4) and a.min() >= 0 and a.max() < 32
    assert out["objective"] == pytest.approx(out["f_main"] + out["f_mode"])
    assert out["f_mode"] <= 0 and out["proven_optimal"] is True and out["violations"] == []


def test_solve_without_a_family_and_pairwise_encoding():
    # A process of its own: with a time limit HiGHS runs in a forked child, and a fork of the test
    # process (the threads of the runtimes earlier tests loaded) is not the fork a user's solve makes.
    p = cli("solve", "-w", "2", "-t", "2", "--synthetic", "core:4 pu:1", "--encoding", "pairwise",
            "--without", "11-12,8p", "--time-limit", "60", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["encoding"] == "pairwise" and "11-12" not in out["families"]


def test_topology_json_fields():
    p = run("topology", "--synthetic", "pack:2 l1:2 core:1 pu:2", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["logical_cores"] == list(range(8))
    assert len(out["physical_core"]) == 8
    d = np.array(out["distance"])
    assert d.shape == (8, 8) and np.all(np.diag(d) == 1) and d[0, 1] == 4 and d[0, 4] == 200


def test_topology_text_of_this_machine():
    p = run("topology")
    assert p.returncode == 0, p.stderr
    assert "logical cores" in p.stdout


@pytest.mark.parametrize("args", [
    ("solve", "-w", "0", "-t", "2"),
    ("solve", "-w", "2", "-t", "-1"),
    ("solve", "-w", "x", "-t", "2"),
    ("solve", "-w", "2", "-t", "2", "--time-limit", "0"),
    ("solve", "-w", "2", "-t", "2", "--preset", "no-such-machine"),
    ("solve", "-w", "2", "-t", "2", "--synthetic", "pack:2 core:"),
    ("solve", "-w", "2", "-t", "2", "--without", "nonsense"),
    ("solve", "-w", "3", "-t", "3", "--synthetic", "core:4 pu:1", "--without", "8"),  # (11-12) needs (8)
    ("topology", "--hwloc-xml", "/no/such/file.xml"),
    ("topology", "--preset", "a", "--synthetic", "core:2 pu:1"),
    ("frobnicate",),
    # Refused before anything is measured (a traceback after the measurement would lose it).
    ("sweep", "--batches", "100,abc", "--out", "{tmp}/s"),
    ("sweep", "--models", ",", "--out", "{tmp}/s"),
    ("sweep", "--seed", "-1", "--out", "{tmp}/s"),
    ("sweep", "--out", "{tmp}/file", "--configs", "1x1"),
    ("sweep", "--grid", "article", "--budget", "10x", "--out", "{tmp}/s"),
    ("run", "-w", "1", "-t", "1", "--seed", "-1"),
    ("run", "-w", "1", "-t", "1", "--out", "{tmp}/file"),
])
def test_bad_input_is_one_line_on_stderr_and_exit_2(args, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    args = [a.format(tmp=tmp_path) for a in args]
    p = run(*args)
    assert p.returncode == 2
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0]
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("args, message", [
    (("--hwloc-xml", "/no/such/file.xml"), "file.xml: cannot read hwloc XML"),
    # a preset's name given as a synthetic spec is a spec that does not parse, not the preset
    (("--synthetic", "xeon-8272cl"), "synthetic spec 'xeon-8272cl': cannot parse"),
    (("--preset", "nope"), "unknown preset 'nope'; valid presets: xeon-8272cl"),
])
def test_each_topology_option_is_read_as_what_it_names(args, message):
    p = run("topology", *args)
    assert p.returncode == 2 and p.stderr.startswith(f"tuna-lab: error: {message}")


def test_a_shape_no_mapping_fits_is_one_line_at_once():
    """200 workers of 2 threads on 384 cores: (11-12) leaves every main alone on its core, so the 200
    rank-1 threads need 200 other cores, of which there are 184 - the patterns of the physical cores
    prove it in a second, where HiGHS on the full model found nothing in minutes."""
    p = run("solve", "-w", "200", "-t", "2", "--mode", "compact", "--preset", "epyc-9654-2s", "--time-limit", "10",
            "--strict-families")
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "no mapping of W=200 x T=2 on 384 cores: (2) and (11-12)" in lines[0]


def test_topology_from_an_hwloc_xml_file():
    from pathlib import Path

    xml = Path(__file__).resolve().parent / "data" / "v1_pack2_l3_smt.xml"
    p = run("topology", "--hwloc-xml", str(xml))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("Topology('v1_pack2_l3_smt.xml', C=8, P=4, packages=2")


def test_truncated_hwloc_xml_is_a_clear_error(tmp_path):
    bad = tmp_path / "cut.xml"
    bad.write_text('<?xml version="1.0"?>\n<topology version="2.0">\n  <object type="Machine"')
    p = run("topology", "--hwloc-xml", str(bad))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1


def test_public_api_is_what_the_readme_documents():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert set(tuna_lab.__all__) == {"solve", "Topology", "TunaModel", "Mapping", "TunaError", "TopologyError",
                                     "ModelError", "InfeasibleModelError", "NoSolutionError"}
    for name in tuna_lab.__all__:
        assert getattr(tuna_lab, name) is not None
        assert name in readme, f"{name} is public but the README does not mention it"


# ------------------------------------------------------------ help, --version, --json 
def _subcommands():
    """``{name: parser}`` of every ``tuna-lab`` sub-command."""
    import argparse

    from tuna_lab.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return parser, dict(sub.choices)


def test_every_option_has_help_and_every_command_an_example():
    parser, commands = _subcommands()
    assert {"topology", "solve", "run", "sweep", "report", "demo", "advise"} <= set(commands)
    missing, no_example = [], []
    for name, sub in [("tuna-lab", parser), *commands.items()]:
        for action in sub._actions:
            if action.dest == "help" or action.dest == "command":
                continue
            if not (action.help or "").strip():
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
        examples = [line.strip() for line in (sub.epilog or "").splitlines()]
        if not any(line.startswith("tuna-lab ") for line in examples):
            no_example.append(name)
    assert not missing, f"options without help: {missing}"
    assert not no_example, f"commands without an example in their epilog: {no_example}"


def test_every_example_parses():
    import re
    import shlex

    parser, commands = _subcommands()
    examples = [line.strip() for sub in [parser, *commands.values()] for line in (sub.epilog or "").splitlines()
                if line.strip().startswith("tuna-lab ")]
    assert len(examples) >= len(commands)
    for example in examples:
        # drop the note after two spaces and a redirection; MASTER stands for a PID
        command = re.split(r"\s{2,}| > ", example)[0].replace("MASTER", "1234")
        args = parser.parse_args(shlex.split(command)[1:])
        assert callable(args.func), example


def test_help_shows_meaningful_defaults_only():
    _, commands = _subcommands()
    texts = {name: sub.format_help() for name, sub in commands.items()}
    assert "(default: 5)" in texts["run"] and "(default: cfs,round-robin,tuna-scatter)" in texts["run"]
    noise = [name for name, text in texts.items() if "(default: None)" in text or "(default: False)" in text]
    assert not noise, noise
    # examples keep their lines as written
    assert "\n  tuna-lab run -w 2 -t 2 --model small --trials 3 --requests 200\n" in texts["run"]


def test_version():
    p = run("--version")
    assert p.returncode == 0 and p.stdout == f"tuna-lab {tuna_lab.__version__}\n"


@pytest.mark.parametrize("module", ["tuna_lab", "tuna_lab.cli"])
def test_the_entry_points_exit_with_the_commands_status(module):
    """``python -m tuna_lab`` and ``python -m tuna_lab.cli`` as processes: 0, and 2 with one line on bad input."""
    ok = cli("--version", module=module, timeout=120)
    assert ok.returncode == 0 and ok.stdout == f"tuna-lab {tuna_lab.__version__}\n" and ok.stderr == ""
    bad = cli("solve", "-w", "0", "-t", "2", module=module, timeout=120)
    assert bad.returncode == 2 and bad.stdout == "" and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "error" in bad.stderr


def test_first_training_says_it_happens_once(tmp_path, monkeypatch, capsys):
    from tuna_lab.server import models

    monkeypatch.setenv("TUNA_LAB_CACHE", str(tmp_path))
    # The training itself is test_server_app's; here only what the user is told around it.
    monkeypatch.setattr(models, "_train_in_child", lambda name, path, nthread: path.write_bytes(b"model"))
    path = models.ensure_model("small")
    first = capsys.readouterr()
    assert first.out == ""
    said = first.err.splitlines()
    assert said[0] == f"training the small model once (cached in {tmp_path}) ..."
    assert said[1].startswith("trained the small model in ") and said[1].endswith(" s")
    assert models.ensure_model("small") == path and capsys.readouterr().err == ""   # cached: silent


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """``run --json`` of a tiny cell, then ``sweep --json`` over it plus one more cell: 3 short servers."""
    from tuna_lab.measure.experiment import Config

    out = tmp_path_factory.mktemp("cli") / "results"
    r = run("run", "-w", "1", "-t", "1", "--model", "small", "--batch", "10", "--policies", "cfs,round-robin",
            "--trials", "1", "--requests", "20", "--out", out, "--json")
    s = run("sweep", "--configs", "1x1,2x1", "--models", "small", "--batches", "10", "--policies", "cfs",
            "--trials", "1", "--requests", "20", "--out", out, "--json")
    keys = [Config(1, 1, "small", 10).key, Config(2, 1, "small", 10).key]
    return out, keys, r, s


@pytest.mark.server
def test_run_json_has_the_summary_and_the_files(measured):
    out, keys, p, _ = measured
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) == 1                  # the object only: progress is on stderr
    assert "trial 1/1" in p.stderr
    obj = json.loads(p.stdout)
    assert obj["cell"] == keys[0] and obj["path"] == str(out / keys[0])
    assert {row["policy"] for row in obj["summary"]} == {"cfs", "round-robin"}
    cfs = next(row for row in obj["summary"] if row["policy"] == "cfs")
    assert 0 < cfs["p50"] <= cfs["p99"] and cfs["p99_speedup_vs_cfs"] == pytest.approx(1.0)
    assert str(out / keys[0] / "manifest.json") in obj["files"]
    assert all(os.path.exists(f) for f in obj["files"])
    assert [s["policy"] for s in obj["speedups"]] == ["round-robin"]
    # the generator's own CPU, next to the server's
    assert cfs["generator_cpu_per_request"] > 0 and cfs["cpu_per_request"] > 0
    assert obj["generator"]["cpu_seconds"] > 0 and obj["generator"]["requests"] == 2 * 20


@pytest.mark.skipif(len(os.sched_getaffinity(0)) >= 8, reason="the default keeps a core from 8 CPUs")
@pytest.mark.server
def test_run_says_once_that_the_generator_shares_the_servers_cpus(measured):
    _, _, p, s = measured
    said = [line for line in p.stderr.splitlines() if "load generator" in line]
    assert said == ["tuna-lab: the load generator shares the server's CPUs "
                    f"({len(os.sched_getaffinity(0))} usable CPUs, fewer than 8); its own CPU use is recorded; "
                    "reserve some with --client-cpus CPULIST"]
    assert json.loads(p.stdout)["client_cpus"]["cpus"] == []
    assert sum("load generator" in line for line in s.stderr.splitlines()) == 1      # a sweep says it once too


@pytest.mark.server
def test_sweep_json_tells_done_from_skipped(measured):
    out, keys, _, p = measured
    assert p.returncode == 0, p.stderr
    assert "1 of 2 cells already finished" in p.stderr and len(p.stdout.splitlines()) == 1
    obj = json.loads(p.stdout)
    assert obj["skipped"] == [str(out / keys[0])] and obj["done"] == [str(out / keys[1])]
    assert obj["configurations"] == 2 and obj["out"] == str(out)


@pytest.mark.server
def test_the_sweep_records_its_settings_in_a_folder_of_an_older_sweep(measured):
    out, keys, _, p = measured
    assert p.returncode == 0, p.stderr
    obj = json.loads(p.stdout)
    assert obj["not_run"] == [] and obj["cuts"] == [] and obj["design"] is None
    # The folder held a `run` cell and no sweep.json (an older sweep): it resumed and got one.
    settings = json.loads((out / "sweep.json").read_text())
    assert settings["configs"] == sorted(keys) and settings["requests"] == 20 and settings["trials"] == 1
    assert settings["policies"] == ["cfs"] and settings["version"] == tuna_lab.__version__
    # A resume with the same settings: test_experiment's test of sweep() (this command's only caller of it).


def test_a_resume_with_other_settings_is_refused_and_writes_nothing(tmp_path):
    from tuna_lab.measure.experiment import Config
    from tuna_lab.measure.store import write_sweep_file
    from tuna_lab.measure.sweeps.local import sweep_settings

    out = tmp_path / "old"
    write_sweep_file(out, sweep_settings([Config(w, 1, "small", 10) for w in (1, 2)], ["cfs"], trials=1,
                                         requests=20))
    before = sorted(os.listdir(out)), (out / "sweep.json").read_text()
    # Other trials (and the library's test: policies) are refused alike; the message names each difference.
    p = run("sweep", "--configs", "1x1,3x1", "--trials", "1", "--requests", "30", "--models", "small", "--batches",
            "10", "--policies", "cfs", "--out", out)
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "holds a sweep with other settings" in lines[0]
    assert "configs: 1 not given now (e.g. w2-t1-small-b10), 1 new (e.g. w3-t1-small-b10)" in lines[0]
    assert "requests 20 there, 30 now" in lines[0]
    assert (sorted(os.listdir(out)), (out / "sweep.json").read_text()) == before


@pytest.mark.server
def test_report_json_has_the_path_and_headline_speedups(measured, tmp_path):
    out, _, _, _ = measured
    html = tmp_path / "r.html"
    p = run("report", out, "-o", html, "--json")
    assert p.returncode == 0, p.stderr
    obj = json.loads(p.stdout)
    assert obj["report"] == str(html) and html.is_file() and obj["cells"] == 2
    rr = [s for s in obj["speedups"] if s["baseline"] == "cfs" and s["policy"] == "round-robin"]
    assert len(rr) == 1 and rr[0]["applications"] == 1 and rr[0]["speedup"] > 0
    cpu = obj["cpu"]
    assert {(r["workers"], r["policy"]) for r in cpu} == {(1, "cfs"), (1, "round-robin"), (2, "cfs")}
    assert all(r["server_cpu_per_request"] > 0 and r["generator_cpu_per_request"] > 0 for r in cpu)
    assert "generator CPU ms/req" in html.read_text()


def test_preset_help_names_every_preset():
    # the help is written out (the parser must not import numpy); it must not drift from PRESETS
    from tuna_lab.machine.readers.synthetic import PRESETS

    _, commands = _subcommands()
    (action,) = [a for a in commands["solve"]._actions if "--preset" in a.option_strings]
    named = action.help.split(":", 1)[1].replace(" ", "").split(",")
    assert sorted(named) == sorted(PRESETS)
