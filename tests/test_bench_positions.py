"""benchmarks/positions.py and benchmarks/decode_threads.py: the structure of their reports (speed is never tested)."""

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_positions_reports_each_choice_side_by_side_and_the_bytes(tmp_path):
    report = load("positions").main(["--device", "cpu", "--steps", "3", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "positions.json").read_text()) == report
    assert set(report["p50_ms"]) == {"learned", "rope", "alibi"} and report["ratio_to_learned"]["learned"] == 1.0
    assert report["bytes"]["learned_table"] == 1024 * 256 * 4 and report["bytes"]["rope_cos_sin_per_layer"] == 1024 * 64 * 2 * 4
    assert report["threads"] == 1 and "say nothing about a GPU" in report["note"]


def test_decode_threads_measures_every_count_idle_and_loaded(tmp_path):
    report = load("decode_threads").main(["--steps", "2", "--out", str(tmp_path)])
    counts = sorted({1, 2, report["cores"]})
    assert [(r["busy_processes"], r["threads"]) for r in report["rows"]] == [(b, t) for b in (0, report["cores"]) for t in counts]
    assert report["generate_default_threads"] == 1 and set(report["fastest_threads"]) == {"idle", "under_load"}
