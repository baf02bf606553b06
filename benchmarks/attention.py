"""`make bench`: explicit vs tiled attention vs F.scaled_dot_product_attention as the context T grows.

For T = 256 … 4096 (causal mask) time the three implementations with tinytf.bench.benchmark — the
forward under no_grad and forward+backward — and measure their peak memory, in fp32 on a CPU and
also in fp16/bf16 on CUDA. The tiled one is tinytf.tiled_attention (plain PyTorch, an online
softmax over block × block tiles; --block sets the tile). Writes build/bench/attention.json (every
result with its conditions, the growth ratio each time T doubles and the ratios between
implementations) and build/bench/attention.png.

    python benchmarks/attention.py [--device cpu|cuda|auto] [--tokens 256 512 ...] [--modes forward fwd+bwd]
                                   [--block 64] [--threads N] [--out build/bench]
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

IMPLS = ("explicit", "tiled", "sdpa")
MODES = {"forward": "forward, no_grad", "fwd+bwd": "forward + backward"}


def attention_fn(impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mode: str, block: int):
    """A no-argument callable running one causal attention (q, k, v ``[B, H, T, d]``): the forward
    under no_grad, or (mode ``"fwd+bwd"``) forward and backward with a fixed upstream gradient."""
    if impl == "explicit":
        def attn():
            return tinytf.scaled_dot_product_attention(q, k, v, is_causal=True)
    elif impl == "tiled":
        def attn():
            return tinytf.tiled_attention(q, k, v, is_causal=True, block_q=block, block_k=block)
    else:
        def attn():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if mode == "forward":
        return torch.no_grad()(attn)
    d_out = torch.randn_like(q)

    def train():
        for t in (q, k, v):
            t.grad = None  # fresh gradients each call: the peak includes dq, dk, dv once
        attn().backward(d_out)
    return train


def series_of(rows: list[dict], impl: str, mode: str, dtype: str) -> list[dict]:
    return sorted((r for r in rows if r["impl"] == impl and r["mode"] == mode and r["dtype"] == dtype), key=lambda r: r["T"])


def growth(rows: list[dict], key: str) -> list[dict]:
    """Ratio of ``key`` between consecutive T (each T doubles), per implementation, mode and dtype."""
    out = []
    for impl, mode, dtype in sorted({(r["impl"], r["mode"], r["dtype"]) for r in rows}):
        series = series_of(rows, impl, mode, dtype)
        for a, b in zip(series, series[1:]):
            if a[key] and b[key]:
                out.append({"impl": impl, "mode": mode, "dtype": dtype, "T": f"{a['T']}->{b['T']}", "metric": key,
                            "ratio": b[key] / a[key]})
    return out


def versus(rows: list[dict]) -> list[dict]:
    """Per (mode, dtype, T): tiled time and peak relative to explicit and to the fused kernel."""
    out = []
    index = {(r["impl"], r["mode"], r["dtype"], r["T"]): r for r in rows}
    for (impl, mode, dtype, t), r in sorted(index.items()):
        exp, fused = index.get(("explicit", mode, dtype, t)), index.get(("sdpa", mode, dtype, t))
        if impl != "tiled" or exp is None or fused is None:
            continue
        out.append({"mode": mode, "dtype": dtype, "T": t,
                    "explicit_over_tiled_time": exp["median_ms"] / r["median_ms"],
                    "tiled_over_fused_time": r["median_ms"] / fused["median_ms"],
                    "explicit_over_tiled_peak": exp["peak_bytes"] / max(r["peak_bytes"], 1),
                    "tiled_over_fused_peak": r["peak_bytes"] / max(fused["peak_bytes"], 1)})
    return out


def plot(rows: list[dict], device_name: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.6))
    for impl, marker in zip(IMPLS, "o^s"):
        for mode, dtype in sorted({(r["mode"], r["dtype"]) for r in rows}):
            series = series_of(rows, impl, mode, dtype)
            if not series:
                continue
            ts = [r["T"] for r in series]
            style = "-" if mode == "forward" else "--"
            label = f"{impl} ({series[0]['backend']}), {dtype}, {MODES[mode]}"
            ax_t.plot(ts, [r["median_ms"] for r in series], style, marker=marker, label=label)
            ax_m.plot(ts, [r["peak_bytes"] / 2**20 for r in series], style, marker=marker, label=label)
    for ax, ylabel in ((ax_t, "median latency (ms)"), (ax_m, "peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length T")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_m.legend(fontsize=6)
    c = rows[0]
    where = device_name + ("" if c["conditions"]["device_type"] == "cuda" else " (a CPU figure: says nothing about a GPU)")
    fig.suptitle(f"causal attention, B={c['B']}, H={c['heads']}, d={c['head_dim']}, median of {c['conditions']['iters']} "
                 f"after {c['conditions']['warmup']} warm-up calls, {c['conditions']['threads']} threads, torch "
                 f"{c['conditions']['torch']} — {where}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=os.environ.get("TINYTF_DEVICE", "auto"))
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    parser.add_argument("--block", type=int, default=64, help="block_q = block_k of the tiled implementation")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--out", default="build/bench")
    args = parser.parse_args(argv)

    device = tinytf.pick_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = measure(args, device)
    ratios = growth(rows, "median_ms") + growth(rows, "peak_bytes")
    device_name = tinytf.describe_device(device)
    report = {
        "benchmark": "causal attention: tinytf explicit vs tinytf tiled vs F.scaled_dot_product_attention",
        "device": str(device),
        "device_name": device_name,
        "note": "CPU figures: they say nothing about GPU performance." if device.type != "cuda" else "CUDA figures.",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "tiled_block": args.block,
        "results": rows,
        "growth_when_T_doubles": ratios,
        "tiled_versus_others": versus(rows),
    }
    (out_dir / "attention.json").write_text(json.dumps(report, indent=2))
    plot(rows, device_name, out_dir / "attention.png")
    print_report(report, args)
    print(f"wrote {out_dir / 'attention.json'} and {out_dir / 'attention.png'}")
    return report


def measure(args: argparse.Namespace, device: torch.device) -> list[dict]:
    """One :func:`tinytf.benchmark` result per (dtype, mode, T, implementation), with its conditions."""
    dtypes = [torch.float32] + ([torch.float16, torch.bfloat16] if device.type == "cuda" else [])
    torch.manual_seed(0)
    rows = []
    points = [(dt, mode, t, impl) for dt in dtypes for mode in args.modes for t in args.tokens for impl in args.impls]
    bar = tqdm(points, desc="attention bench", unit="pt")
    for dtype, mode, t, impl in bar:
        name = tinytf.memory.dtype_name(dtype)
        bar.set_postfix_str(f"{impl} {mode} T={t} {name}")
        q, k, v = (torch.randn(args.batch, args.heads, t, args.head_dim, device=device, dtype=dtype, requires_grad=mode == "fwd+bwd")
                   for _ in range(3))
        backend = {"explicit": "tinytf explicit (materialises [B,H,T,T])",
                   "tiled": f"tinytf tiled ({args.block}x{args.block} tiles, online softmax)"}.get(impl)
        backend = backend or sdpa_backend(q.detach(), k.detach(), v.detach(), is_causal=True)
        res = benchmark(attention_fn(impl, q, k, v, mode, args.block), warmup=args.warmup, iters=args.iters, device=device,
                        name=f"{impl} {mode} T={t}", B=args.batch, T=t, heads=args.heads, head_dim=args.head_dim,
                        dtype=name, backend=backend, causal=True, mode=MODES[mode], block=args.block if impl == "tiled" else None)
        rows.append(res.to_dict() | {"impl": impl, "mode": mode, "T": t, "dtype": name, "backend": backend,
                                     "B": args.batch, "heads": args.heads, "head_dim": args.head_dim,
                                     "scores_bytes": attention_matrix_bytes(args.batch, args.heads, t, dtype)})
        del q, k, v
    return rows


def print_report(report: dict, args: argparse.Namespace) -> None:
    rows, ratios = report["results"], report["growth_when_T_doubles"]
    print(f"\n{report['benchmark']} on {report['device_name']} (torch {report['torch']}, {report['threads']} threads); {report['note']}")
    print(f"causal, B={args.batch}, H={args.heads}, d={args.head_dim}, tiled block {args.block}, "
          f"warmup {args.warmup}, iters {args.iters} (medians)")
    print(f"{'impl':9} {'mode':9} {'dtype':5} {'T':>5} {'median ms':>10} {'p99 ms':>9} {'tokens/s':>10} {'peak':>11}  backend")
    for r in rows:
        print(f"{r['impl']:9} {r['mode']:9} {r['dtype']:5} {r['T']:>5} {r['median_ms']:>10.2f} {r['p99_ms']:>9.2f} "
              f"{r['tokens_per_s']:>10,.0f} {format_bytes(r['peak_bytes']):>11}  {r['backend']}")
    print("growth when T doubles (median time | peak memory):")
    for impl, mode, dtype in sorted({(r["impl"], r["mode"], r["dtype"]) for r in rows}):
        pick = [x for x in ratios if (x["impl"], x["mode"], x["dtype"]) == (impl, mode, dtype)]
        tr = " x".join(f"{x['ratio']:.2f}" for x in pick if x["metric"] == "median_ms")
        mr = " x".join(f"{x['ratio']:.2f}" for x in pick if x["metric"] == "peak_bytes")
        print(f"  {impl:9} {mode:9} {dtype}: time x{tr} | memory x{mr}")
    print("tiled vs explicit and vs the fused kernel:")
    for x in report["tiled_versus_others"]:
        print(f"  {x['mode']:9} {x['dtype']} T={x['T']:>5}: explicit/tiled time {x['explicit_over_tiled_time']:.2f}x, "
              f"tiled/fused time {x['tiled_over_fused_time']:.2f}x, explicit/tiled peak {x['explicit_over_tiled_peak']:.1f}x, "
              f"tiled/fused peak {x['tiled_over_fused_peak']:.2f}x")


if __name__ == "__main__":
    main()
