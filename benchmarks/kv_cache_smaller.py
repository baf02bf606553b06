"""`make bench`: smaller KV caches — fewer K/V heads, and a sliding window with its rolling cache.

The model of benchmarks/kv_cache.py (4 layers, D=256, random weights, 16-token prompt, batch 1, fp32):

* for each K/V head count (default H, H/2, 1: multi-head, grouped-query, multi-query; the models are
  ``tinytf.to_grouped_query`` of the same MHA model) the measured bytes of the cache tensors after the
  longest generation — their ratio to multi-head must be ``heads / kv_heads`` exactly (asserted) — and
  the cached generation's tokens/s;
* with a sliding window W (default 64) and its rolling cache: the measured cache bytes at every
  decode step over at least 4·W tokens (asserted flat) next to what a full cache would hold, the
  generation checked token for token against recomputation under the window mask, and its tokens/s.

Writes build/bench/kv_cache_smaller.json (every figure with its conditions) and build/bench/kv_cache_smaller.png.

    python benchmarks/kv_cache_smaller.py [--device cpu|cuda|auto] [--new-tokens 512] [--kv-heads 4 2 1] [--window 64]
                                          [--threads N] [--out build/bench]
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from kv_cache import build, model_arguments, model_facts  # the benchmark beside this one: its model and command line
from tqdm.auto import tqdm

import tinytf
from tinytf.bench import benchmark
from tinytf.memory import format_bytes, kv_cache_bytes


def storage_bytes(cache) -> int:
    """Measured: bytes of the storages behind the cache's K and V tensors (not the formula)."""
    return sum(t.untyped_storage().nbytes() for t in (cache.k, cache.v))


def grouped_rows(model, prompt, n: int, kv_list: list[int], device, repeats: int, cond: dict) -> list[dict]:
    """Cache bytes (measured after ``n`` new tokens) and cached tokens/s for each K/V head count."""
    heads, rows = model.config.heads, []
    for kv in tqdm(kv_list, desc="K/V heads", unit="model"):
        m = tinytf.to_grouped_query(model, kv).eval()
        if not torch.equal(tinytf.generate(m, prompt, 32, temperature=0), tinytf.generate(m, prompt, 32, temperature=0, use_cache=False)):
            raise SystemExit(f"kv_heads={kv}: cached generation differs from recomputation: not benchmarking it")
        cache = tinytf.KVCache.for_model(m, prompt.size(0), max_tokens=prompt.size(1) + n)
        with torch.inference_mode():
            m(prompt, cache=cache)
            nxt = prompt[:, -1:]
            for _ in range(n):
                nxt = m(nxt, cache=cache)[:, -1:].argmax(-1)
        r = benchmark(lambda m=m: tinytf.generate(m, prompt, n, temperature=0), warmup=1, iters=repeats, device=device,
                      tokens=prompt.size(0) * n, memory=False, name=f"kv_heads={kv}", kv_heads=kv, **cond)
        rows.append({"kv_heads": kv, "kind": "MHA" if kv == heads else "MQA" if kv == 1 else "GQA",
                     "cache_bytes_measured": storage_bytes(cache), "tokens": cache.seen,
                     "cache_bytes_formula": kv_cache_bytes(prompt.size(0), m.config.layers, heads, cache.seen,
                                                           m.config.dim // heads, torch.float32, kv_heads=kv),
                     "tokens_per_s": r.tokens_per_s, "median_s": r.median_ms / 1e3})
    full = next((r for r in rows if r["kv_heads"] == heads), None)
    for r in rows:
        if full is not None:  # the saving factor is exact: integer bytes, no rounding
            r["saving"] = full["cache_bytes_measured"] / r["cache_bytes_measured"]
            assert full["cache_bytes_measured"] == r["cache_bytes_measured"] * (heads // r["kv_heads"]), r
        assert r["cache_bytes_measured"] == r["cache_bytes_formula"], r
    return rows


def rolling_report(model, prompt, window: int, n: int, device, repeats: int, cond: dict) -> dict:
    """A windowed copy of ``model``: measured rolling-cache bytes per decode step, exactness, tokens/s."""
    if n < 4 * window:
        raise SystemExit(f"--window {window} needs at least {4 * window} new tokens (4x the window); got {n}")
    m = tinytf.TinyLanguageModel(model.config, window=window).to(device).eval()
    m.load_state_dict(model.state_dict())
    same = torch.equal(tinytf.generate(m, prompt, n, temperature=0), tinytf.generate(m, prompt, n, temperature=0, use_cache=False))
    if not same:
        raise SystemExit("rolling-cache generation differs from recomputation under the window mask: not benchmarking it")
    cache, sizes = tinytf.RollingKVCache.for_model(m, prompt.size(0)), []
    with torch.inference_mode():
        nxt = m(prompt, cache=cache)[:, -1:].argmax(-1)
        for _ in range(n - 1):
            nxt = m(nxt, cache=cache)[:, -1:].argmax(-1)
            sizes.append(storage_bytes(cache))
    assert len(set(sizes)) == 1, "the rolling cache grew"
    c = m.config
    full = [kv_cache_bytes(prompt.size(0), c.layers, c.heads, prompt.size(1) + i + 2, c.dim // c.heads, torch.float32)
            for i in range(n - 1)]
    r = benchmark(lambda: tinytf.generate(m, prompt, n, temperature=0), warmup=1, iters=repeats, device=device,
                  tokens=prompt.size(0) * n, memory=False, name=f"window={window}", window=window, **cond)
    return {"window": window, "new_tokens": n, "tokens_seen": cache.seen, "times_window": cache.seen / window,
            "identical_to_recompute": same, "rolling_bytes_per_step": sizes, "full_cache_bytes_per_step": full,
            "flat": True, "rolling_bytes": sizes[0], "full_cache_bytes_at_end": full[-1],
            "tokens_per_s": r.tokens_per_s, "median_s": r.median_ms / 1e3}


def plot_smaller(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, roll = report["grouped"], report["rolling"]
    fig, (ax_a, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = [f"{r['kind']}\nkv_heads={r['kv_heads']}" for r in rows]
    bars = ax_a.bar(names, [r["cache_bytes_measured"] / 2**20 for r in rows], color="#4c72b0")
    for bar, r in zip(bars, rows):
        ax_a.annotate(f"{r['tokens_per_s']:,.0f} tok/s", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                      xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
    ax_a.set_ylabel(f"KV cache after {rows[0]['tokens']} tokens (MiB, measured)")
    ax_a.set_title("fewer K/V heads: cache bytes and cached tokens/s")
    steps = range(1, len(roll["rolling_bytes_per_step"]) + 1)
    ax_b.plot(steps, [b / 2**20 for b in roll["full_cache_bytes_per_step"]], label="full cache (every token)")
    ax_b.plot(steps, [b / 2**20 for b in roll["rolling_bytes_per_step"]], label=f"rolling cache, window={roll['window']}")
    ax_b.set_xlabel("decode steps")
    ax_b.set_ylabel("cache bytes (MiB, measured for the rolling one)")
    ax_b.set_title("sliding window: memory stays flat")
    ax_b.legend(fontsize=8)
    for ax in (ax_a, ax_b):
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"{report['device_name']}, fp32, B={report['model']['batch']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_summary(report: dict, out_dir: Path) -> None:
    grouped, rolling = report["grouped"], report["rolling"]
    print(f"\n{report['benchmark']}\non {report['device_name']}, torch {torch.__version__}")
    print(f"smaller caches after {grouped[0]['tokens']} tokens (measured tensor bytes; ratio asserted = heads / kv_heads):")
    for r in grouped:
        print(f"  {r['kind']:>3} kv_heads={r['kv_heads']:<2} {format_bytes(r['cache_bytes_measured']):>10}  "
              f"{r.get('saving', float('nan')):4.1f}x smaller  {r['tokens_per_s']:>8,.0f} tok/s (cached generate, median)")
    if rolling is not None:
        print(f"  window={rolling['window']}: rolling cache {format_bytes(rolling['rolling_bytes'])} at every one of "
              f"{len(rolling['rolling_bytes_per_step'])} decode steps ({rolling['times_window']:.1f}x the window; a full cache "
              f"reaches {format_bytes(rolling['full_cache_bytes_at_end'])}); tokens identical to recomputation; "
              f"{rolling['tokens_per_s']:,.0f} tok/s")
    print(f"wrote {out_dir / 'kv_cache_smaller.json'}, {out_dir / 'kv_cache_smaller.png'}")


def main(argv: list[str] | None = None) -> dict:
    parser = model_arguments(__doc__)
    parser.add_argument("--new-tokens", type=int, default=512, help="tokens generated after the prompt")
    parser.add_argument("--kv-heads", type=int, nargs="+", default=None,
                        help="K/V head counts to compare (default: heads, heads/2, 1 = MHA, GQA, MQA)")
    parser.add_argument("--window", type=int, default=64, help="sliding window of the rolling-cache run (0: skip it)")
    args = parser.parse_args(argv)
    n, out_dir = args.new_tokens, Path(args.out)
    device, model, prompt, cond = build(args, n)
    kv_list = args.kv_heads or sorted({args.heads, max(1, args.heads // 2), 1}, reverse=True)
    report = {
        "benchmark": "smaller KV caches: fewer K/V heads (tinytf.to_grouped_query) and a rolling cache for a sliding window",
        "device": str(device),
        "device_name": tinytf.describe_device(device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "model": model_facts(args, model, n),
        "grouped": grouped_rows(model, prompt, n, kv_list, device, args.repeats, cond),
        "rolling": rolling_report(model, prompt, args.window, n, device, args.repeats, cond) if args.window else None,
    }
    (out_dir / "kv_cache_smaller.json").write_text(json.dumps(report, indent=2))
    plot_smaller(report, out_dir / "kv_cache_smaller.png")
    print_summary(report, out_dir)
    return report


if __name__ == "__main__":
    main()
