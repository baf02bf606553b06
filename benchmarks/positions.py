"""`make bench`: what positions cost a decode step — RoPE and ALiBi against learned positions, side by side.

The same model shape with each position choice — 4 layers, D=256, H=4, V=256, random weights, B=1, fp32, a
16-token prompt, then cached greedy decode steps — timed **one step of each model in turn** (tinytf.bench's
``decode_step_times``), so that the machine's load hits every model alike; medians and their ratios to learned
positions, on one intra-op thread (``tinytf.generate``'s default). Also the bytes each keeps: the learned table
(max_tokens x D, a parameter) and RoPE's cos/sin tables (max_tokens x d_head x 2 per layer, rebuilt, never saved).

    python benchmarks/positions.py [--device cpu|cuda|auto] [--steps 300] [--threads 1] [--out build/bench]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch

import tinytf
from tinytf.bench import decode_step_times

SCHEMES = ("learned", "rope", "alibi")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=os.environ.get("TINYTF_DEVICE", "auto"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="build/bench")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = tinytf.pick_device(args.device)
    shape = dict(vocab=256, dim=256, heads=4, layers=4, max_tokens=1024)
    torch.manual_seed(0)
    models = {s: tinytf.TinyLanguageModel(**shape, positions=s).to(device).eval() for s in SCHEMES}
    decode_step_times(models, steps=20, threads=args.threads)  # warm-up: allocations, the RoPE tables
    times = decode_step_times(models, steps=args.steps, threads=args.threads)
    p50 = {s: statistics.median(ms) for s, ms in times.items()}
    rope = models["rope"].blocks[0].attn.rope
    cos, _ = rope.tables(0, shape["max_tokens"], device)
    report = {
        "benchmark": "decode step of each position choice, side by side (one step of each model in turn)",
        "model": shape, "B": 1, "prompt": 16, "steps": args.steps, "threads": args.threads, "dtype": "fp32",
        "device_name": tinytf.describe_device(device), "torch": torch.__version__,
        "p50_ms": p50, "p99_ms": {s: tinytf.bench.percentile(ms, 99) for s, ms in times.items()},
        "ratio_to_learned": {s: p50[s] / p50["learned"] for s in SCHEMES},
        "bytes": {"learned_table": models["learned"].position.weight.nbytes,
                  "rope_cos_sin_per_layer": cos.nbytes * 2, "rope_layers": shape["layers"]},
        "note": ("CPU figures: they say nothing about a GPU. " if device.type != "cuda" else "CUDA figures. ")
        + "Medians of per-step times measured in turn; the ratios are what to read on a loaded machine.",
    }
    (out / "positions.json").write_text(json.dumps(report, indent=2))
    print(f"\n{report['benchmark']}\non {report['device_name']}, {args.threads} thread(s), torch {torch.__version__}; {report['note']}")
    print("shape: layers=4, D=256, H=4, V=256, B=1, prompt 16, fp32, greedy")
    for s in SCHEMES:
        print(f"  {s:>8}: decode step p50 {p50[s]:6.3f} ms  ({report['ratio_to_learned'][s]:.3f}x learned)")
    b = report["bytes"]
    print(f"bytes: learned table {b['learned_table']:,}; RoPE cos+sin {b['rope_cos_sin_per_layer']:,} per layer x {b['rope_layers']} "
          f"layers (rebuilt, never saved); wrote {out / 'positions.json'}")
    return report


if __name__ == "__main__":
    main()
