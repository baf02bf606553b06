"""`make bench`: how much of the ring's communication the double buffer hides, on this machine.

For each size, ``P`` gloo processes (one thread each) run one rank's ring-attention forward three ways in
interleaved rounds — blocking (:func:`tinytf.ring_attention`), overlapped (``overlap=True``: post the next
exchange, compute, then wait) and silent (the same loop over a ring that sends nothing) — and report the p50
times and the exposed communication ``t - t_silent`` of the blocking and the overlapped ring, and their ratio
(:mod:`tinytf.overlap`; the two rings' outputs are checked equal first). The ratio of the rank that waits
longer is the one that decides a step. CPU processes share this machine's cores with gloo's transport
threads: the numbers describe this machine, not a GPU cluster (chapter 12, section 9, has the GPU model).

Writes build/bench/ring_overlap.json (every figure with its conditions) and build/bench/ring_overlap.png.

    python benchmarks/ring_overlap.py [--world 2] [--heads 8] [--head-dim 64] [--tokens-per-rank 64 128 256 512]
                                      [--repeats 21] [--out build/bench]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import torch
from tqdm.auto import tqdm

from tinytf.launch import run_processes
from tinytf.overlap import overlap_job


def measure(world: int, heads: int, head_dim: int, sizes: list[int], repeats: int) -> list[dict]:
    rows = []
    for n in tqdm(sizes, desc="T/P", unit="size"):
        ranks = run_processes(overlap_job, world, heads, n, head_dim, repeats, timeout_s=600)
        worst = max(ranks, key=lambda r: r["ratio"])
        rows.append({"tokens_per_rank": n, "T": n * world, "ratio": worst["ratio"],
                     "per_rank": [{"p50_ms": {k: v * 1e3 for k, v in r["p50"].items()},
                                   "exposed_ms": {k: v * 1e3 for k, v in r["exposed"].items()}, "ratio": r["ratio"]} for r in ranks]})
    return rows


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = report["rows"]
    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(10, 3.8))
    n = [r["tokens_per_rank"] for r in rows]
    for key, label in (("blocking", "blocking"), ("overlapped", "overlapped"), ("silent", "silent (compute only)")):
        ax_t.plot(n, [max(p["p50_ms"][key] for p in r["per_rank"]) for r in rows], marker="o", label=label)
    ax_t.set(xscale="log", yscale="log", xlabel="T/P (tokens per rank)", ylabel="ring forward, p50 (ms), slower rank",
             title="one rank's ring forward")
    ax_t.legend(fontsize=8)
    ax_r.plot(n, [r["ratio"] for r in rows], marker="o", color="#c44e52")
    ax_r.axhline(1.0, color="gray", lw=0.8)
    ax_r.set(xscale="log", ylim=(0, 1.3), xlabel="T/P (tokens per rank)", ylabel="exposed: overlapped / blocking",
             title="communication left exposed by the double buffer")
    for ax in (ax_t, ax_r):
        ax.set_xticks(n, [str(x) for x in n], minor=False)
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.grid(True, alpha=0.3)
    c = report["conditions"]
    fig.suptitle(f"P = {c['world']} gloo processes on {c['cpu_count']} cores, {c['heads']} heads x {c['head_dim']}, fp32, "
                 f"p50 of {c['repeats']} rounds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--tokens-per-rank", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--device", default="cpu", help="ignored: the ranks are CPU processes (gloo)")
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    conditions = {"world": args.world, "heads": args.heads, "head_dim": args.head_dim, "repeats": args.repeats, "dtype": "fp32",
                  "threads_per_rank": 1, "backend": "gloo", "cpu_count": os.cpu_count(), "load_average": os.getloadavg(),
                  "machine": platform.processor() or platform.machine(), "torch": torch.__version__}
    report = {"benchmark": "ring attention: exposed communication, blocking vs double-buffered", "conditions": conditions,
              "rows": measure(args.world, args.heads, args.head_dim, args.tokens_per_rank, args.repeats)}
    (args.out / "ring_overlap.json").write_text(json.dumps(report, indent=1))
    plot(report, args.out / "ring_overlap.png")
    print(f"\n{report['benchmark']}: P = {args.world}, {args.heads} heads x {args.head_dim}, fp32, p50 of {args.repeats} rounds, "
          f"load average {conditions['load_average'][0]:.1f} on {conditions['cpu_count']} cores")
    for r in report["rows"]:
        slow = max(r["per_rank"], key=lambda p: p["ratio"])
        t = slow["p50_ms"]
        print(f"  T/P = {r['tokens_per_rank']:>4}: blocking {t['blocking']:7.2f} ms, overlapped {t['overlapped']:7.2f} ms,"
              f" silent {t['silent']:7.2f} ms; exposed {slow['exposed_ms']['blocking']:6.2f} -> "
              f"{slow['exposed_ms']['overlapped']:6.2f} ms, ratio {r['ratio']:.2f}")
    print(f"wrote {args.out / 'ring_overlap.json'}, {args.out / 'ring_overlap.png'}")
    return report


if __name__ == "__main__":
    main()
