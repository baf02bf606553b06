"""`make bench`: greedy generation with and without the KV cache as the generated length grows.

A 4-layer, D=256 TinyLanguageModel (random weights: speed does not depend on what it learned)
generates 64, 128, 256, 512 new tokens after a 16-token prompt, batch 1 (``--batch``), fp32:

* tokens/s of ``tinytf.generate(use_cache=True)`` (one prefill + one decode step per token) and of
  ``use_cache=False`` (every step recomputes the whole prefix), timed end to end with
  ``tinytf.bench.benchmark``; medians, and their ratio (the speed-up);
* the time of ONE decode step against the context it attends over (cached: nearly flat, it reads the
  weights plus a cache that grows by one token per step) next to the time of one recompute step
  (a forward over the whole context, which grows with it).

Smaller caches (fewer K/V heads, a sliding window) are benchmarks/kv_cache_smaller.py, on the same
model (``model_arguments`` and ``build`` below serve both).

Writes build/bench/kv_cache.json (every figure with its conditions) and build/bench/kv_cache.png.

    python benchmarks/kv_cache.py [--device cpu|cuda|auto] [--new-tokens 64 128 ...] [--threads N] [--out build/bench]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

import tinytf
from tinytf.bench import benchmark
from tinytf.memory import format_bytes, kv_cache_bytes

GOAL_SPEEDUP = 15.0  # at the longest generation, on 2 CPU cores (issue 5)


def with_cpu_time(fn):
    """Wrap ``fn`` so each call also records this process's CPU seconds (``time.process_time``).

    On a shared machine wall time includes the time the process waited for a core; CPU time does
    not, so with ONE thread it is the steadier figure (with several threads it adds up their spinning)."""
    record: list[float] = []

    def wrapped():
        t0 = time.process_time()
        out = fn()
        record.append(time.process_time() - t0)
        return out

    return wrapped, record


def decode_step_times(model: tinytf.TinyLanguageModel, prompt: torch.Tensor, steps: int, device: torch.device) -> list[float]:
    """Seconds of each single-token decode step after a prefill of ``prompt`` [B, T0]; step i attends over T0 + i + 1 keys."""
    cache = tinytf.KVCache.for_model(model, prompt.size(0), max_tokens=prompt.size(1) + steps)
    times = []
    with torch.inference_mode():
        logits = model(prompt, cache=cache)[:, -1]
        for _ in range(steps):
            nxt = logits.argmax(dim=-1, keepdim=True)  # [B, 1]
            tinytf.synchronize(device)
            t0 = time.perf_counter()
            logits = model(nxt, cache=cache)[:, -1]
            tinytf.synchronize(device)
            times.append(time.perf_counter() - t0)
    return times


def bucket_medians(times: list[float], start_context: int, width: int) -> list[dict]:
    """Median step time (ms) per window of ``width`` consecutive contexts."""
    out = []
    for i in range(0, len(times), width):
        chunk = times[i : i + width]
        out.append({"context_from": start_context + i + 1, "context_to": start_context + i + len(chunk),
                    "context_mid": start_context + i + (len(chunk) + 1) / 2, "median_ms": 1e3 * statistics.median(chunk)})
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, curve = report["generation"], report["per_token"]
    ns = [r["new_tokens"] for r in rows]
    fig, (ax_a, ax_b, ax_c) = plt.subplots(1, 3, figsize=(14, 4.2))
    ax_a.plot(ns, [r["cached_tokens_per_s"] for r in rows], "o-", label="KV cache")
    ax_a.plot(ns, [r["recompute_tokens_per_s"] for r in rows], "s-", label="recompute the prefix")
    ax_a.set_yscale("log")
    ax_a.set_ylabel("tokens/s (median, end to end)")
    ax_a.set_title("generation throughput")
    ax_b.plot(ns, [r["speedup"] for r in rows], "o-", color="#55a868")
    ax_b.axhline(GOAL_SPEEDUP, color="#b00020", ls="--", lw=1, label=f"goal {GOAL_SPEEDUP:g}×")
    for r in rows:
        ax_b.annotate(f"{r['speedup']:.1f}×", (r["new_tokens"], r["speedup"]), xytext=(4, -12), textcoords="offset points", fontsize=8)
    ax_b.set_ylabel("speed-up (recompute time / cached time)")
    ax_b.set_title("KV-cache speed-up")
    for ax in (ax_a, ax_b):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("new tokens generated")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax_c.plot([b["context_mid"] for b in curve["cached_buckets"]], [b["median_ms"] for b in curve["cached_buckets"]], "o-",
              label="decode step with cache (1 token)")
    ax_c.plot([p["context"] for p in curve["recompute"]], [p["median_ms"] for p in curve["recompute"]], "s-",
              label="recompute step (whole context)")
    ax_c.set_yscale("log")
    ax_c.set_xlabel("context length (tokens attended over)")
    ax_c.set_ylabel("time per generated token (ms, median)")
    ax_c.set_title("per-token time vs context")
    ax_c.grid(True, which="both", alpha=0.3)
    ax_c.legend(fontsize=8)
    m = report["model"]
    fig.suptitle(f"TinyLanguageModel layers={m['layers']}, D={m['dim']}, H={m['heads']}, V={m['vocab']}, B={m['batch']}, fp32, "
                 f"{m['backend']} attention — {report['device_name']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def model_arguments(doc: str) -> argparse.ArgumentParser:
    """The command line both KV-cache benchmarks share: the device, the model, the prompt, the timing."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--device", default=os.environ.get("TINYTF_DEVICE", "auto"))
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1, help="sequences generated together (tokens/s counts all of them)")
    parser.add_argument("--backend", default="explicit", choices=["explicit", "sdpa"])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per length with the cache (median)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--out", default="build/bench")
    return parser


def build(args: argparse.Namespace, n_max: int) -> tuple[torch.device, tinytf.TinyLanguageModel, torch.Tensor, dict]:
    """``(device, model, prompt [B, T0], conditions)`` for ``n_max`` new tokens, after checking that the
    cache does not change a single token of a greedy generation."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = tinytf.pick_device(args.device)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = tinytf.TinyLanguageModel(vocab=args.vocab, dim=args.dim, heads=args.heads, layers=args.layers,
                                     max_tokens=args.prompt + n_max, backend=args.backend).to(device).eval()
    prompt = torch.randint(0, args.vocab, (args.batch, args.prompt), device=device)
    cond = dict(B=args.batch, prompt=args.prompt, dtype="fp32", backend=args.backend, layers=args.layers, dim=args.dim,
                heads=args.heads, vocab=args.vocab, decoding="greedy")
    # correctness first: the cache must not change a single token
    same = torch.equal(tinytf.generate(model, prompt, 32, temperature=0),
                       tinytf.generate(model, prompt, 32, temperature=0, use_cache=False))
    if not same:
        raise SystemExit("KV-cache generation differs from recomputation: not benchmarking a wrong result")
    return device, model, prompt, cond


def model_facts(args: argparse.Namespace, model: tinytf.TinyLanguageModel, n_max: int) -> dict:
    return {"layers": args.layers, "dim": args.dim, "heads": args.heads, "head_dim": args.dim // args.heads,
            "vocab": args.vocab, "max_tokens": args.prompt + n_max, "batch": args.batch, "backend": args.backend,
            "parameters": tinytf.count_parameters(model)}


def speed_rows(model, prompt, args: argparse.Namespace, device, cond: dict) -> tuple[list[dict], dict]:
    """Cached and recomputed generation per length (medians, speed-up, CPU-time speed-up); and the conditions."""
    rows = []
    bar = tqdm(sorted(args.new_tokens), desc="kv-cache bench", unit="length")
    for n in bar:
        bar.set_postfix_str(f"{n} new tokens, cached")
        fn, cached_cpu = with_cpu_time(lambda n=n: tinytf.generate(model, prompt, n, temperature=0))
        cached = benchmark(fn, warmup=1, iters=args.repeats, device=device, tokens=args.batch * n, memory=False, name=f"cached n={n}",
                           T=args.prompt + n, **cond)
        bar.set_postfix_str(f"{n} new tokens, recompute")
        fn, slow_cpu = with_cpu_time(lambda n=n: tinytf.generate(model, prompt, n, temperature=0, use_cache=False))
        slow = benchmark(fn, warmup=0, iters=args.recompute_repeats, device=device, tokens=args.batch * n, memory=False,
                         name=f"recompute n={n}", T=args.prompt + n, **cond)
        cached_cpu_s, slow_cpu_s = statistics.median(cached_cpu[1:]), statistics.median(slow_cpu)  # [1:]: drop the warm-up
        rows.append({
            "new_tokens": n,
            "cached_median_s": cached.median_ms / 1e3, "cached_tokens_per_s": cached.tokens_per_s, "cached_runs": args.repeats,
            "recompute_median_s": slow.median_ms / 1e3, "recompute_tokens_per_s": slow.tokens_per_s,
            "recompute_runs": args.recompute_repeats,
            "speedup": slow.median_ms / cached.median_ms,
            "cached_cpu_s": cached_cpu_s, "recompute_cpu_s": slow_cpu_s, "cpu_time_speedup": slow_cpu_s / cached_cpu_s,
            "cache_bytes": kv_cache_bytes(args.batch, args.layers, args.heads, args.prompt + n, args.dim // args.heads, torch.float32),
        })
    return rows, cached.conditions


def per_token_curve(model, prompt, args: argparse.Namespace, n_max: int, device) -> dict:
    """Per-token time against the context: decode steps with the cache vs one recompute forward."""
    runs = [decode_step_times(model, prompt, n_max, device) for _ in range(args.step_runs)]
    steps = [statistics.median(ts) for ts in zip(*runs)]  # per context: the median over runs (filters preemption spikes)
    buckets = bucket_medians(steps, args.prompt, width=32)
    recompute_pts = []
    with torch.inference_mode():
        for ctx in sorted({args.prompt * 2, 64, 128, 256, args.prompt + n_max} - {0}):
            if ctx > args.prompt + n_max:
                continue
            ids = torch.randint(0, args.vocab, (args.batch, ctx), device=device)
            r = benchmark(lambda ids=ids: model(ids)[:, -1], warmup=1, iters=3, device=device, memory=False, tokens=1)
            recompute_pts.append({"context": ctx, "median_ms": r.median_ms})
    return {
        "method": f"decode steps: median over {args.step_runs} sweeps per context, then median per 32-context bucket; "
        "recompute: median of 3 forwards over the whole context",
        "cached_steps_ms": [1e3 * t for t in steps],
        "cached_buckets": buckets,
        "recompute": recompute_pts,
        "cached_last_over_first_bucket": buckets[-1]["median_ms"] / buckets[0]["median_ms"],
        "recompute_last_over_first": recompute_pts[-1]["median_ms"] / recompute_pts[0]["median_ms"],
    }


def print_summary(report: dict, args: argparse.Namespace, out_dir: Path) -> None:
    rows, curve, m = report["generation"], report["per_token"], report["model"]
    buckets, recompute_pts = curve["cached_buckets"], curve["recompute"]
    flat, grow = curve["cached_last_over_first_bucket"], curve["recompute_last_over_first"]
    print(f"\n{report['benchmark']}\non {report['device_name']}, torch {torch.__version__}; {report['note']}")
    print(f"model: layers={m['layers']}, D={m['dim']}, H={m['heads']}, V={m['vocab']}, {m['parameters']:,} parameters, "
          f"{args.backend} attention; prompt {args.prompt} tokens, B={args.batch}, fp32, greedy")
    print(f"{'new':>5} {'cached s':>9} {'tok/s':>8} {'recompute s':>12} {'tok/s':>8} {'speed-up':>9} {'cache':>10}  "
          "CPU-time speed-up")
    for r in rows:
        print(f"{r['new_tokens']:>5} {r['cached_median_s']:>9.3f} {r['cached_tokens_per_s']:>8,.0f} {r['recompute_median_s']:>12.3f} "
              f"{r['recompute_tokens_per_s']:>8,.0f} {r['speedup']:>8.1f}x {format_bytes(r['cache_bytes']):>10}  "
              f"{r['cpu_time_speedup']:.1f}x")
    print(f"per-token decode step with the cache: {buckets[0]['median_ms']:.2f} ms at context {buckets[0]['context_from']}-"
          f"{buckets[0]['context_to']} -> {buckets[-1]['median_ms']:.2f} ms at {buckets[-1]['context_from']}-"
          f"{buckets[-1]['context_to']} (x{flat:.2f}); one recompute step: {recompute_pts[0]['median_ms']:.1f} ms at "
          f"{recompute_pts[0]['context']} -> {recompute_pts[-1]['median_ms']:.1f} ms at {recompute_pts[-1]['context']} (x{grow:.1f})")
    goal = report["goal"]
    print(f"goal >= {GOAL_SPEEDUP:g}x at {goal['speedup_at']} new tokens: {goal['measured']:.1f}x ({'met' if goal['met'] else 'NOT met'})")
    print(f"wrote {out_dir / 'kv_cache.json'}, {out_dir / 'kv_cache.png'}")


def main(argv: list[str] | None = None) -> dict:
    parser = model_arguments(__doc__)
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--step-runs", type=int, default=3, help="decode-step sweeps for the per-token curve (median per step)")
    parser.add_argument("--recompute-repeats", type=int, default=1, help="timed runs per length without it (slow)")
    args = parser.parse_args(argv)
    n_max, out_dir = max(args.new_tokens), Path(args.out)
    device, model, prompt, cond = build(args, n_max)
    rows, conditions = speed_rows(model, prompt, args, device, cond)
    best = rows[-1]
    report = {
        "benchmark": "greedy generation with the KV cache vs recomputing the prefix (tinytf.generate)",
        "device": str(device),
        "device_name": tinytf.describe_device(device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "note": ("CPU figures: they say nothing about GPU performance. " if device.type != "cuda" else "CUDA figures. ")
        + "Medians of end-to-end generate() calls (prefill included); the recompute path is timed "
        f"{args.recompute_repeats}x per length because each run is long. speedup = wall-time ratio (the headline); "
        "cpu_time_speedup = ratio of process CPU seconds (steadier on a shared machine, meaningful with 1 thread).",
        "model": model_facts(args, model, n_max),
        "conditions": conditions,
        "generation": rows,
        "per_token": per_token_curve(model, prompt, args, n_max, device),
        "goal": {"speedup_at": best["new_tokens"], "target": GOAL_SPEEDUP, "measured": best["speedup"],
                 "met": best["speedup"] >= GOAL_SPEEDUP},
    }
    (out_dir / "kv_cache.json").write_text(json.dumps(report, indent=2))
    plot(report, out_dir / "kv_cache.png")
    print_summary(report, args, out_dir)
    return report


if __name__ == "__main__":
    main()
