"""`make bench`: tinytf's cached greedy generation next to Hugging Face `transformers`' GPT-2 `generate`.

The same model shape on both sides — 4 layers, D=256, H=4, V=256, MLP 4·D, learned positions,
random weights (speed does not depend on what a model learned) — batch 1, fp32, a 16-token prompt
and 512 new tokens, greedy, every step through a KV cache (``tinytf.generate(use_cache=True)`` and
``GPT2LMHeadModel.generate(do_sample=False, use_cache=True)`` with ``min_new_tokens`` so that it never
stops early). Medians of end-to-end calls, prefill included, and their ratio. The goal (issue 15):
tinytf at least as fast.

``transformers`` is an optional bench extra (``pip install -e '.[bench]'``), never a dependency of
tinytf: without it this benchmark says so, writes the reason to build/bench/hf_generate.json and
exits 0. GPT-2 also has biases in every linear layer and ties its output layer to the embedding, so
its parameter count differs a little; both counts are reported.

    python benchmarks/hf_generate.py [--device cpu|cuda|auto] [--new-tokens 512] [--repeats 5] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

import tinytf
from tinytf.bench import benchmark


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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=os.environ.get("TINYTF_DEVICE", "auto"))
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--out", default="build/bench")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = tinytf.pick_device(args.device)
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

    ours = tinytf.TinyLanguageModel(**shape).to(device).eval()
    hf = hf.to(device).eval()
    prompt = torch.randint(0, shape["vocab"], (1, args.prompt), device=device)
    n = args.new_tokens
    if hf_generate(hf, prompt, n).shape != tinytf.generate(ours, prompt, n, temperature=0).shape:
        raise SystemExit("the two generations differ in length: not comparing them")
    common = dict(warmup=1, iters=args.repeats, device=device, tokens=n, memory=False, B=1, T=args.prompt + n, dtype="fp32")
    mine = benchmark(lambda: tinytf.generate(ours, prompt, n, temperature=0), name="tinytf.generate", backend="explicit", **common)
    theirs = benchmark(lambda: hf_generate(hf, prompt, n), name="GPT2LMHeadModel.generate", backend="transformers", **common)
    ratio = theirs.median_ms / mine.median_ms
    report.update({
        "device_name": tinytf.describe_device(device), "threads": torch.get_num_threads(), "torch": torch.__version__,
        "transformers": transformers.__version__,
        "parameters": {"tinytf": tinytf.count_parameters(ours), "gpt2": sum(p.numel() for p in hf.parameters())},
        "tinytf": {"median_s": mine.median_ms / 1e3, "tokens_per_s": mine.tokens_per_s, "conditions": mine.conditions},
        "transformers_gpt2": {"median_s": theirs.median_ms / 1e3, "tokens_per_s": theirs.tokens_per_s,
                              "conditions": theirs.conditions},
        "tinytf_speedup": ratio, "goal": {"target": "tinytf at least as fast (speed-up >= 1)", "met": ratio >= 1.0},
        "note": ("CPU figures: they say nothing about a GPU. " if device.type != "cuda" else "CUDA figures. ")
        + f"Medians of {args.repeats} end-to-end generate calls after one warm-up, prefill included.",
    })
    (out / "hf_generate.json").write_text(json.dumps(report, indent=2))
    print(f"\n{report['benchmark']}\non {report['device_name']}, {report['threads']} threads, torch {torch.__version__}, "
          f"transformers {transformers.__version__}; {report['note']}")
    print(f"shape: layers=4, D=256, H=4, V=256, B=1, prompt {args.prompt}, {n} new tokens, fp32, greedy; parameters "
          f"tinytf {report['parameters']['tinytf']:,}, GPT-2 {report['parameters']['gpt2']:,}")
    print(f"  tinytf.generate            {mine.median_ms / 1e3:7.3f} s  {mine.tokens_per_s:8,.0f} tok/s")
    print(f"  GPT2LMHeadModel.generate   {theirs.median_ms / 1e3:7.3f} s  {theirs.tokens_per_s:8,.0f} tok/s")
    print(f"tinytf {ratio:.2f}x the speed of transformers (goal >= 1: {'met' if ratio >= 1 else 'NOT met'}); "
          f"wrote {out / 'hf_generate.json'}")
    return report


if __name__ == "__main__":
    main()
