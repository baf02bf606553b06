"""benchmarks/hf_generate.py: transformers stays optional, and the comparison is of the same shape (speed is never tested)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "hf_generate.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("hf_generate_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_transformers_it_says_so_and_measures_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    report = load_bench().main(["--device", "cpu", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "hf_generate.json").read_text())
    assert "not installed" in report["skipped"] and saved == report
    assert "tinytf" not in saved and "tinytf_speedup" not in saved


def test_with_transformers_both_sides_generate_the_same_shape(tmp_path):
    pytest.importorskip("transformers")
    report = load_bench().main(["--device", "cpu", "--new-tokens", "8", "--repeats", "1", "--threads", "1,2", "--load", "0",
                                "--positions", "learned,rope", "--out", str(tmp_path)])
    params = report["parameters"]
    assert abs(params["tinytf"] - params["gpt2"]) / params["gpt2"] < 0.05  # same shape; GPT-2 adds biases, ties the output
    for side in ("tinytf", "transformers_gpt2"):
        c = report[side]["conditions"]
        assert c["B"] == 1 and c["T"] == 16 + 8 and c["dtype"] == "fp32" and c["device_type"] == "cpu"
    assert report["tinytf_speedup"] == pytest.approx(report["transformers_gpt2"]["median_s"] / report["tinytf"]["median_s"])
    assert "say nothing about a GPU" in report["note"]
    grid = report["grid"]  # every threads x load x positions condition, side by side (no busy processes here: the
    assert len(grid) == 2 * 1 * 2 and {(r["threads"], r["busy_processes"], r["positions"]) for r in grid} == {  # tests beside it
        (t, 0, p) for t in (1, 2) for p in ("learned", "rope")}                                                 # are the load)
    assert all((r["tinytf_on_torch_threads_tokens_per_s"] is None) == (r["threads"] == 1) for r in grid)
    assert report["goal"]["met"] == all(r["tinytf_speedup"] >= 1 for r in grid)
