"""``tuna-lab bench load``: tuna_lab's generator and Debian's wrk against one real server.

Nothing here is timed or compared with a target (that is the bench's job):
the tests check that each side runs end to end and reports positive numbers.
wrk is installed by the bench itself when missing (as root); where it cannot
be, the wrk tests are skipped.
"""

import json
import math

import pytest

from tuna_lab.cli import main
from tuna_lab.errors import LoadError
from tuna_lab.bench.load import compare_with_wrk, ensure_wrk, format_table, run_wrk
from tuna_lab.measure.loadgen.load import payload
from tuna_lab.measure.loadgen.trivial import trivial_endpoint

# alone: it measures the load generator's overhead (tests/conftest.py)
pytestmark = pytest.mark.alone

WRK = ensure_wrk()
needs_wrk = pytest.mark.skipif(WRK is None, reason="wrk is not installed and could not be installed")


@needs_wrk
def test_run_wrk_reports_throughput_latency_and_its_own_cpu():
    with trivial_endpoint(keep_alive=False) as url:
        result = run_wrk(url, payload("small", 2), connections=4, duration=1.0, wrk=WRK)
    assert result["tool"] == "wrk" and result["errors"] == 0
    assert result["requests"] > 0 and result["rps"] > 0 and result["seconds"] > 0
    assert 0 < result["p50"] <= result["p99"]
    assert result["cpu_user"] + result["cpu_sys"] > 0
    assert result["cpu_per_request"] == pytest.approx((result["cpu_user"] + result["cpu_sys"])
                                                      / result["requests"])


def test_run_wrk_refuses_a_remote_url_and_a_missing_tool():
    with pytest.raises(LoadError, match="loopback"):
        run_wrk("http://example.com/", b"{}", wrk=WRK or "wrk")
    with trivial_endpoint() as url, pytest.raises(LoadError, match="cannot run"):
        run_wrk(url, b"{}", duration=1.0, wrk="/nonexistent/wrk")


@needs_wrk
def test_the_comparison_runs_end_to_end_on_a_real_server(tmp_path, capsys):
    out, doc = tmp_path / "load.csv", tmp_path / "load-bench.md"
    status = main(["bench", "load", "--duration", "1", "--rounds", "1", "--open-duration", "0.5",
                   "--out", str(out), "--doc", str(doc)])
    assert status == 0
    text = capsys.readouterr().out
    table = [line.split() for line in text.splitlines()
             if line.split()[:2] in (["wrk", "1"], ["tuna_lab", "1"], ["tuna_open", "1"])]
    assert sorted(row[0] for row in table) == ["tuna_lab", "tuna_open", "wrk"]
    for row in table:
        rps, p50, p99, cpu, requests = (float(x) for x in row[2:7])
        assert rps > 0 and 0 < p50 <= p99 and cpu > 0 and requests > 0
    assert "CPU per request" in text and "send lag" in text and "tuna_open (open loop" in text
    assert out.read_text().count("\n") == 4  # header + one row per tool
    report = doc.read_text()
    assert "wrk" in report and "usable" in report and "Python" in report and "tuna_lab" in report


@needs_wrk
def test_compare_with_wrk_returns_both_tools_and_the_checks():
    result = compare_with_wrk(duration=1.0, rounds=1, connections=4, open_duration=0.5, wrk=WRK)
    assert sorted(result["medians"]) == ["tuna_lab", "tuna_open", "wrk"]
    for m in result["medians"].values():
        assert m["rps"] > 0 and m["p50"] > 0 and m["cpu_per_request"] > 0
    assert set(result["checks"]) == {"cpu_per_request", "rps", "p50", "open_cpu_per_request", "open_rps",
                                     "open_lag_p99"}
    assert all(isinstance(v, bool) for v in result["checks"].values())
    for ratios in (result["ratios"], result["open_ratios"]):
        assert all(math.isfinite(v) and v > 0 for v in ratios.values())
    # The open loop offered wrk's throughput (measured in the same round, wrk ran first).
    wrk_row, = (r for r in result["rows"] if r["tool"] == "wrk")
    open_row, = (r for r in result["rows"] if r["tool"] == "tuna_open")
    assert open_row["offered"] == wrk_row["rps"] and open_row["errors"] == 0
    assert result["open"]["open_failed"] == 0 and result["open"]["open_requests"] > 0
    json.dumps(result)  # plain data throughout
    lines = format_table(result)
    assert any(line.startswith("wrk") for line in lines) and any(line.startswith("tuna_lab") for line in lines)


def test_bad_bench_input_is_one_line_and_status_2(capsys):
    assert main(["bench", "load", "--rounds", "0"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "rounds" in err and len(err.splitlines()) == 1
    assert captured.out == ""  # refused before any server or tool started
