"""The command line as a user runs it: a real subprocess, stdout/stderr and exit status."""

import json
import subprocess
import sys

import numpy as np
import pytest

import tuna_lab

SOLVE_FIELDS = {"workers", "threads", "mode", "logical_cores", "physical_cores", "assignment", "f_main",
                "f_mode", "objective", "status", "proven_optimal", "gap", "build_seconds", "solve_seconds"}


def run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "tuna_lab.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


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
    p = run("solve", "-w", "2", "-t", "2", "--synthetic", "core:4 pu:1", "--encoding", "pairwise",
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
])
def test_bad_input_is_one_line_on_stderr_and_exit_2(args):
    p = run(*args)
    assert p.returncode == 2
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0]
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("args, message", [
    (("--hwloc-xml", "/no/such/file.xml"), "file.xml: cannot read hwloc XML"),
    # a preset's name given as a synthetic spec is a spec that does not parse, not the preset
    (("--synthetic", "xeon-8272cl"), "synthetic spec 'xeon-8272cl': cannot parse"),
    (("--preset", "nope"), "unknown preset 'nope'; valid presets: xeon-8272cl"),
])
def test_each_topology_option_is_read_as_what_it_names(args, message):
    p = run("topology", *args)
    assert p.returncode == 2 and p.stderr.startswith(f"tuna-lab: error: {message}")


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
