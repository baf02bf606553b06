"""`make bench`: tinytf's cached greedy generation next to Hugging Face `transformers`' GPT-2 `generate`.

The same model shape on both sides — 4 layers, D=256, H=4, V=256, MLP 4·D, random weights (speed does
not depend on what a model learned) — batch 1, fp32, a 16-token prompt and 256 new tokens, greedy, every
step through a KV cache (``tinytf.generate(use_cache=True)`` and ``GPT2LMHeadModel.generate(do_sample=False,
use_cache=True)`` with ``min_new_tokens`` so that it never stops early). Measured at 1 and 2 torch threads,
on an idle machine and under a load of one busy process per core that the benchmark starts itself, with
tinytf's learned positions and with RoPE (GPT-2 has learned positions). ``tinytf.generate`` decodes with its
default ``threads=1``; GPT-2 runs on torch's setting. Medians of end-to-end calls, prefill included, and
their ratio. The goal (issues 15 and 37): tinytf at least as fast in every condition.

``transformers`` is an optional bench extra (``pip install -e '.[bench]'``), never a dependency of
tinytf: without it this benchmark says so, writes the reason to build/bench/hf_generate.json and
exits 0. GPT-2 also has biases in every linear layer and ties its output layer to the embedding, so
its parameter count differs a little; both counts are reported.

    python benchmarks/hf_generate.py [--device cpu|cuda|auto] [--new-tokens 256] [--repeats 3] [--threads 1,2]
                                     [--load 0,all] [--positions learned,rope]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

import tinytf
from tinytf.bench import cpu_load
from tinytf.device import synchronize


def gpt2_like(layers: int, dim: int, heads: int, vocab: int, positions: int):
    """A randomly initialised GPT2LMHeadModel of the given shape, or None when ``transformers`` is missing."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return None
    cfg = GPT2Config(n_layer=layers, n_embd=dim, n_head=heads, vocab_size=vocab, n_positions=positions,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    return GPT2LMHeadModel(cfg)


def hf_generate(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """Greedy, cached, exactly ``n`` new tokens: ids ``[B, T0 + n]``."""
    with torch.inference_mode():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, use_cache=True, pad_token_id=0)


def _counts(text: str, cores: int) -> list[int]:
    """``"0,all"`` -> ``[0, cores]``: comma-separated counts, ``all`` = one per core."""
    return [cores if part.strip() == "all" else int(part) for part in text.split(",") if part.strip()]


def _pair(ours, hf, prompt: torch.Tensor, n: int, repeats: int, device, threads_ours: int | None) -> dict:
    """tinytf.generate (``threads=threads_ours``) and GPT-2's generate **interleaved**: one warm-up call each, then
    ``repeats`` rounds of one call of each, so that a change in the machine's load hits both alike. Median seconds."""
    calls = {"tinytf": lambda: tinytf.generate(ours, prompt, n, temperature=0, threads=threads_ours),
             "gpt2": lambda: hf_generate(hf, prompt, n)}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for fn in calls.values():
        fn()  # warm-up
    for _ in range(repeats):
        for name, fn in calls.items():
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(ts) for name, ts in times.items()}
    conditions = {"B": 1, "T": prompt.size(1) + n, "dtype": "fp32", "device_type": device.type,
                  "device_name": tinytf.describe_device(device), "threads": torch.get_num_threads(), "repeats": repeats,
                  "interleaved": True, "torch": torch.__version__}
    return {name: {"median_s": median[name], "tokens_per_s": n / median[name], "times_s": times[name], "conditions": conditions}
            for name in calls} | {"speedup": median["gpt2"] / median["tinytf"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=os.environ.get("TINYTF_DEVICE", "auto"))
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", default="1,2", help="torch intra-op thread counts to measure at, comma-separated")
    parser.add_argument("--load", default="0,all", help="busy processes during a measurement: counts, 'all' = one per core")
    parser.add_argument("--positions", default="learned,rope", help="tinytf's position choices to measure")
    parser.add_argument("--out", default="build/bench")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = tinytf.pick_device(args.device)
    cores = os.cpu_count() or 1
    threads_grid, loads = _counts(args.threads, cores), _counts(args.load, cores) if device.type == "cpu" else [0]
    positions = [p.strip() for p in args.positions.split(",") if p.strip()]
    shape = {"layers": 4, "dim": 256, "heads": 4, "vocab": 256, "max_tokens": args.prompt + args.new_tokens}

    torch.manual_seed(0)
    hf = gpt2_like(shape["layers"], shape["dim"], shape["heads"], shape["vocab"], shape["max_tokens"])
    report: dict = {"benchmark": "cached greedy generation: tinytf.generate vs transformers GPT-2 generate",
                    "model": shape, "B": 1, "prompt": args.prompt, "new_tokens": args.new_tokens, "dtype": "fp32"}
    if hf is None:
        report["skipped"] = "transformers is not installed (optional: pip install -e '.[bench]'); nothing measured"
        (out / "hf_generate.json").write_text(json.dumps(report, indent=2))
        print(report["skipped"])
        return report

    import transformers

    models = {p: tinytf.TinyLanguageModel(**shape, positions=p).to(device).eval() for p in positions}
    hf = hf.to(device).eval()
    prompt = torch.randint(0, shape["vocab"], (1, args.prompt), device=device)
    n = args.new_tokens
    if hf_generate(hf, prompt, n).shape != tinytf.generate(models[positions[0]], prompt, n, temperature=0).shape:
        raise SystemExit("the two generations differ in length: not comparing them")
    before = torch.get_num_threads()
    grid = []
    try:
        for load in loads:
            with cpu_load(load):
                for threads in threads_grid:
                    torch.set_num_threads(threads)  # GPT-2's generate runs on torch's setting
                    for pos in positions:
                        res = _pair(models[pos], hf, prompt, n, args.repeats, device, threads_ours=1)  # tinytf's default
                        own = _pair(models[pos], hf, prompt, n, 1, device, threads_ours=None) if threads > 1 else None
                        grid.append({"busy_processes": load, "threads": threads, "positions": pos,
                                     "tinytf_tokens_per_s": res["tinytf"]["tokens_per_s"],
                                     "gpt2_tokens_per_s": res["gpt2"]["tokens_per_s"], "tinytf_speedup": res["speedup"],
                                     "tinytf_on_torch_threads_tokens_per_s": own["tinytf"]["tokens_per_s"] if own else None,
                                     "_res": res})
    finally:
        torch.set_num_threads(before)
    head = grid[0]["_res"]
    mine, theirs = head["tinytf"], head["gpt2"]
    for row in grid:
        del row["_res"]
    report.update({
        "device_name": tinytf.describe_device(device), "threads": grid[0]["threads"], "torch": torch.__version__,
        "transformers": transformers.__version__,
        "parameters": {"tinytf": tinytf.count_parameters(models[positions[0]]), "gpt2": sum(p.numel() for p in hf.parameters())},
        "tinytf": mine, "transformers_gpt2": theirs,
        "tinytf_speedup": theirs["median_s"] / mine["median_s"],
        "grid": grid,
        "goal": {"target": "tinytf at least as fast (speed-up >= 1) in every condition",
                 "met": all(r["tinytf_speedup"] >= 1.0 for r in grid)},
        "note": ("CPU figures: they say nothing about a GPU. " if device.type != "cuda" else "CUDA figures. ")
        + f"Medians of {args.repeats} end-to-end generate calls of each side, interleaved, after one warm-up each, prefill "
          "included; tinytf.generate with its "
          "default threads=1, GPT-2 on torch's thread setting; under load: one busy process per core started here.",
    })
    (out / "hf_generate.json").write_text(json.dumps(report, indent=2))
    print(f"\n{report['benchmark']}\non {report['device_name']}, torch {torch.__version__}, transformers {transformers.__version__}; "
          f"{report['note']}")
    print(f"shape: layers=4, D=256, H=4, V=256, B=1, prompt {args.prompt}, {n} new tokens, fp32, greedy; parameters "
          f"tinytf {report['parameters']['tinytf']:,}, GPT-2 {report['parameters']['gpt2']:,}")
    for r in grid:
        own = r["tinytf_on_torch_threads_tokens_per_s"]
        print(f"  {'idle' if r['busy_processes'] == 0 else str(r['busy_processes']) + ' busy':>7}, {r['threads']} thread(s), "
              f"{r['positions']:>7}: tinytf {r['tinytf_tokens_per_s']:7,.0f} tok/s, GPT-2 {r['gpt2_tokens_per_s']:7,.0f} tok/s, "
              f"{r['tinytf_speedup']:.2f}x" + (f" (tinytf on {r['threads']} threads: {own:,.0f} tok/s)" if own else ""))
    print(f"goal (tinytf at least as fast everywhere): {'met' if report['goal']['met'] else 'NOT met'}; wrote {out / 'hf_generate.json'}")
    return report


if __name__ == "__main__":
    main()
