"""`make bench`: explicit attention vs F.scaled_dot_product_attention as the context T grows.

For T = 256, 512, 1024, 2048 (causal mask, forward under no_grad) time both implementations with
tinytf.bench.benchmark and measure their peak memory, in fp32 on a CPU and also in fp16/bf16 on
CUDA. Writes build/bench/attention.json (every result with its conditions, plus the growth ratio
each time T doubles) and build/bench/attention.png.

    python benchmarks/attention.py [--device cpu|cuda|auto] [--tokens 256 512 ...] [--out build/bench]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

import tinytf
from tinytf.bench import benchmark, sdpa_backend
from tinytf.memory import attention_matrix_bytes, format_bytes

IMPLS = ("explicit", "sdpa")


def attention_fn(impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """A no-argument callable running one causal attention forward (q, k, v ``[B, H, T, d]``)."""
    if impl == "explicit":
        return lambda: tinytf.scaled_dot_product_attention(q, k, v, is_causal=True)
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)


def growth(rows: list[dict], key: str) -> list[dict]:
    """Ratio of ``key`` between consecutive T (each T doubles), per implementation and dtype."""
    out = []
    for impl in IMPLS:
        for dtype in sorted({r["dtype"] for r in rows}):
            series = sorted((r for r in rows if r["impl"] == impl and r["dtype"] == dtype), key=lambda r: r["T"])
            for a, b in zip(series, series[1:]):
                if a[key] and b[key]:
                    out.append({"impl": impl, "dtype": dtype, "T": f"{a['T']}->{b['T']}", "metric": key, "ratio": b[key] / a[key]})
    return out


def plot(rows: list[dict], device_name: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for impl, marker in zip(IMPLS, "os"):
        for dtype in sorted({r["dtype"] for r in rows}):
            series = sorted((r for r in rows if r["impl"] == impl and r["dtype"] == dtype), key=lambda r: r["T"])
            ts = [r["T"] for r in series]
            label = f"{series[0]['backend']}, {dtype}" if impl == "explicit" else f"F.sdpa: {series[0]['backend']}, {dtype}"
            ax_t.plot(ts, [r["median_ms"] for r in series], marker=marker, label=label)
            ax_m.plot(ts, [r["peak_bytes"] / 2**20 for r in series], marker=marker, label=label)
    for ax, ylabel in ((ax_t, "median latency (ms)"), (ax_m, "peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length T")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_m.legend(fontsize=8)
    c = rows[0]
    where = device_name + ("" if c["conditions"]["device_type"] == "cuda" else " (a CPU figure: says nothing about a GPU)")
    fig.suptitle(f"causal attention forward, B={c['B']}, H={c['heads']}, d={c['head_dim']}, median of {c['conditions']['iters']} "
                 f"after {c['conditions']['warmup']} warm-up calls, torch {c['conditions']['torch']} — {where}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=os.environ.get("TINYTF_DEVICE", "auto"))
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--out", default="build/bench")
    args = parser.parse_args(argv)

    device = tinytf.pick_device(args.device)
    dtypes = [torch.float32] + ([torch.float16, torch.bfloat16] if device.type == "cuda" else [])
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    rows = []
    points = [(t, dt, impl) for dt in dtypes for t in args.tokens for impl in IMPLS]
    bar = tqdm(points, desc="attention bench", unit="pt")
    for t, dtype, impl in bar:
        bar.set_postfix_str(f"{impl} T={t} {tinytf.memory.dtype_name(dtype)}")
        q, k, v = (torch.randn(args.batch, args.heads, t, args.head_dim, device=device, dtype=dtype) for _ in range(3))
        backend = "tinytf explicit (materialises [B,H,T,T])" if impl == "explicit" else sdpa_backend(q, k, v, is_causal=True)
        with torch.no_grad():
            res = benchmark(attention_fn(impl, q, k, v), warmup=args.warmup, iters=args.iters, device=device,
                            name=f"{impl} T={t}", B=args.batch, T=t, heads=args.heads, head_dim=args.head_dim,
                            dtype=tinytf.memory.dtype_name(dtype), backend=backend, causal=True, mode="forward, no_grad")
        rows.append(res.to_dict() | {"impl": impl, "T": t, "dtype": res.conditions["dtype"], "backend": backend,
                                     "B": args.batch, "heads": args.heads, "head_dim": args.head_dim,
                                     "scores_bytes": attention_matrix_bytes(args.batch, args.heads, t, dtype)})
        del q, k, v
    ratios = growth(rows, "median_ms") + growth(rows, "peak_bytes")
    device_name = tinytf.describe_device(device)
    report = {
        "benchmark": "causal attention forward: tinytf explicit vs F.scaled_dot_product_attention",
        "device": str(device),
        "device_name": device_name,
        "note": "CPU figures: they say nothing about GPU performance." if device.type != "cuda" else "CUDA figures.",
        "torch": torch.__version__,
        "results": rows,
        "growth_when_T_doubles": ratios,
    }
    (out_dir / "attention.json").write_text(json.dumps(report, indent=2))
    plot(rows, device_name, out_dir / "attention.png")

    print(f"\n{report['benchmark']} on {device_name} (torch {torch.__version__}); {report['note']}")
    print(f"B={args.batch}, H={args.heads}, d={args.head_dim}, warmup {args.warmup}, iters {args.iters}")
    print(f"{'impl':9} {'dtype':5} {'T':>5} {'median ms':>10} {'p99 ms':>8} {'tokens/s':>10} {'peak':>11}  backend")
    for r in rows:
        print(f"{r['impl']:9} {r['dtype']:5} {r['T']:>5} {r['median_ms']:>10.2f} {r['p99_ms']:>8.2f} "
              f"{r['tokens_per_s']:>10,.0f} {format_bytes(r['peak_bytes']):>11}  {r['backend']}")
    print("growth when T doubles (median time, peak memory):")
    for impl in IMPLS:
        for dtype in sorted({r["dtype"] for r in rows}):
            tr = [f"{x['ratio']:.2f}" for x in ratios if x["impl"] == impl and x["dtype"] == dtype and x["metric"] == "median_ms"]
            mr = [f"{x['ratio']:.2f}" for x in ratios if x["impl"] == impl and x["dtype"] == dtype and x["metric"] == "peak_bytes"]
            print(f"  {impl:9} {dtype}: time x{' x'.join(tr)} | memory x{' x'.join(mr)}")
    print(f"wrote {out_dir / 'attention.json'} and {out_dir / 'attention.png'}")
    return report


if __name__ == "__main__":
    main()
