"""Exercise 7's probes: the inputs of its judges drawn afresh on the student's machine (the self-check).

``PROBES[grade_id](namespace, generator) -> (value, inputs)`` calls the student's objects like the hidden
test of ``grade_id`` does, on independently drawn sizes; :func:`tinytf.course.reference.judge_findings`
hands the result to the grader's judge.
"""

from __future__ import annotations

from typing import Any

import torch

from . import Probe

__all__ = ["PROBES"]


def _size(gen: torch.Generator, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi, (), generator=gen))


def _probe_cache(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    layers, b, h, d = _size(gen, 1, 3), _size(gen, 1, 3), _size(gen, 1, 3), _size(gen, 2, 6)
    cache, writes, returned = ns["SimpleKVCache"](layers), [], []
    for _ in range(_size(gen, 3, 7)):
        layer, t = _size(gen, 0, layers), _size(gen, 1, 3)
        k, v = torch.randn(b, h, t, d, generator=gen), torch.randn(b, h, t, d, generator=gen)
        k_all, v_all = cache.update(layer, k, v)
        writes.append({"layer": layer, "k": k, "v": v})
        returned.append({"k": k_all, "v": v_all})
    return {"returned": returned, "lengths": list(cache.lengths)}, {"layers": layers, "writes": writes}


def _probe_step(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    from tinytf import CausalSelfAttention, KVCache

    heads = _size(gen, 2, 4)  # d_head != D: a scale by the model width shows
    dim, b, prefill = heads * _size(gen, 2, 6), _size(gen, 1, 3), _size(gen, 2, 6)
    n = prefill + 2 + _size(gen, 1, 3)  # then 2 tokens at once after the cached ones (past > 0, t > 1), then decodes
    attn = CausalSelfAttention(dim, heads, max_tokens=n)
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    attn.eval()
    x, cache, fn = torch.randn(b, n, dim, generator=gen), KVCache(1, b, heads, n, dim // heads), ns["attention_step"]
    with torch.no_grad():
        outs = [fn(attn, x[:, :prefill], cache), fn(attn, x[:, prefill : prefill + 2], cache)]
        outs += [fn(attn, x[:, i : i + 1], cache) for i in range(prefill + 2, n)]
    weights = {name.replace(".", "_"): t.detach() for name, t in attn.state_dict().items() if name.startswith(("qkv", "proj"))}
    return torch.cat(outs, dim=1), {"x": x, "prefill": prefill, "heads": heads, **weights}


def _greedy_tokens_differ(model: torch.nn.Module, prompt: torch.Tensor) -> bool:
    """Whether greedy decoding picks a second token other than the first in some row (else a loop that picks token 2
    from step 1's logits would go unseen)."""
    with torch.no_grad():
        tok1 = model(prompt)[:, -1].argmax(-1, keepdim=True)
        tok2 = model(torch.cat([prompt, tok1], dim=1))[:, -1].argmax(-1, keepdim=True)
    return bool((tok1 != tok2).any())


def _probe_generate(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    """A fresh model and prompt whose two greedy tokens differ in some row (redrawn until they do)."""
    from tinytf import KVCache, TinyLanguageModel

    for _ in range(50):
        config = {"vocab": _size(gen, 5, 40), "heads": _size(gen, 1, 3), "layers": _size(gen, 1, 3), "max_tokens": 16}
        config["dim"] = config["heads"] * _size(gen, 2, 6)
        model = TinyLanguageModel(**config)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
        model.eval()
        prompt = torch.randint(0, config["vocab"], (_size(gen, 1, 3), _size(gen, 2, 8)), generator=gen)  # T >= 2: first != last
        if _greedy_tokens_differ(model, prompt):
            break
    ids, logits = ns["generate_two_step"](model, prompt, KVCache.for_model(model, prompt.size(0)))
    ids_r, logits_r = ns["generate_two_step_recompute"](model, prompt)
    value = {"ids": ids, "logits": logits, "ids_recompute": ids_r, "logits_recompute": logits_r}
    return value, {"prompt": prompt, "config": config, "state_dict": dict(model.state_dict())}


PROBES: dict[str, Probe] = {"ex07_cache": _probe_cache, "ex07_step": _probe_step, "ex07_generate": _probe_generate}
