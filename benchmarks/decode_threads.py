"""`make bench`: a decode step's p50 at 1, 2 and all CPU threads, on an idle machine and under a CPU load made here.

A decode step of a small model (4 layers, D=256, H=4, V=256, B=1, fp32) is a few dozen tiny ops; torch splits each over
its intra-op threads, and the threads then wait for each other — far longer when other programs want the cores. The
load is one busy Python process per core (``tinytf.bench.cpu_load``), started and stopped by this benchmark. The
result decides what ``tinytf.generate`` does: it decodes with ``threads=1`` unless told otherwise.

    python benchmarks/decode_threads.py [--steps 100] [--out build/bench]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch

import tinytf
from tinytf.bench import cpu_load, decode_step_times


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", default="build/bench")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    counts = sorted({1, 2, cores})
    torch.manual_seed(0)
    model = {"decode": tinytf.TinyLanguageModel(vocab=256, dim=256, heads=4, layers=4, max_tokens=1024).eval()}
    decode_step_times(model, steps=10, threads=1)  # warm-up
    rows = []
    for load in (0, cores):
        with cpu_load(load):
            for threads in counts:
                ms = decode_step_times(model, steps=args.steps, threads=threads)["decode"]
                rows.append({"busy_processes": load, "threads": threads, "p50_ms": statistics.median(ms),
                             "p99_ms": tinytf.bench.percentile(ms, 99)})
    best = {load: min((r for r in rows if r["busy_processes"] == load), key=lambda r: r["p50_ms"])["threads"] for load in (0, cores)}
    report = {"benchmark": "decode step p50 by intra-op threads, idle and under a CPU load this benchmark makes",
              "model": "4 layers, D=256, H=4, V=256, B=1, fp32, learned positions", "cores": cores, "steps": args.steps,
              "torch": torch.__version__, "torch_default_threads": torch.get_num_threads(), "rows": rows,
              "fastest_threads": {"idle": best[0], "under_load": best[cores]},
              "generate_default_threads": tinytf.generate.__kwdefaults__["threads"],
              "note": "CPU figures: they say nothing about a GPU. 'idle' means no load made here; other work may run."}
    (out / "decode_threads.json").write_text(json.dumps(report, indent=2))
    print(f"\n{report['benchmark']}\n{report['model']}; {cores} cores, torch {torch.__version__} "
          f"(default {torch.get_num_threads()} threads)")
    for r in rows:
        print(f"  {'idle' if r['busy_processes'] == 0 else str(r['busy_processes']) + ' busy processes':>18}, {r['threads']} thread(s): "
              f"p50 {r['p50_ms']:7.2f} ms, p99 {r['p99_ms']:7.2f} ms")
    print(f"fastest: {best[0]} thread(s) idle, {best[cores]} under load; tinytf.generate decodes with threads="
          f"{report['generate_default_threads']}; wrote {out / 'decode_threads.json'}")
    return report


if __name__ == "__main__":
    main()
