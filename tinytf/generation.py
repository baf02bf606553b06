"""Generation: extend a prompt token by token, with a KV cache (one prefill, then one decode step per
token) or without one (recompute the whole prefix each step, the slow reference).

    ids [B, T] --prefill--> logits [B, V] --sample--> next [B, 1] --decode--> logits [B, V] --> ... ids [B, T + n]

:func:`cache_for` builds the cache a model decodes with from ``model.config``: a
:class:`tinytf.KVCache`, or a :class:`tinytf.RollingKVCache` of ``window`` tokens for a sliding-window
model. :func:`sample_next` turns the last logits into the next ids (greedy, temperature, top-k).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from .device import intra_op_threads
from .kvcache import KVCache
from .rolling import RollingKVCache
from .translation import gettext as _

__all__ = ["generate", "cache_for", "sample_next"]


def cache_for(model: nn.Module, batch: int, *, max_tokens: int | None = None) -> KVCache:
    """The cache ``model`` decodes with, from ``model.config``: a :class:`tinytf.RollingKVCache` of
    ``config.window`` tokens when the model has a sliding window, else a :class:`tinytf.KVCache` of
    ``max_tokens`` tokens (default ``config.max_tokens``). Dtype and device are those of its weights."""
    if model.config.window is not None:
        return RollingKVCache.for_model(model, batch)
    return KVCache.for_model(model, batch, max_tokens=max_tokens)


@torch.inference_mode()
def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """logits ``[B, V]`` -> next ids ``[B, 1]``: greedy when ``temperature == 0``, else sampled from
    ``softmax(logits / temperature)`` restricted to the ``top_k`` most likely tokens (all when None)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator)


def _check_request(ids: torch.Tensor, max_new_tokens: int, temperature: float, top_k: int | None, limit: int | None) -> None:
    """``ValueError`` naming the problem with a :func:`generate` call (its prompt, sizes or sampling)."""
    if ids.dim() != 2:
        raise ValueError(_("generate expects ids [B, T], got shape {shape} (add a batch axis with ids[None])")
                         .format(shape=list(ids.shape)))
    if ids.size(1) == 0:
        raise ValueError(_("generate needs a prompt of at least one token, got ids of shape {shape}").format(shape=list(ids.shape)))
    if max_new_tokens < 0:
        raise ValueError(_("max_new_tokens must be >= 0, got {n}").format(n=max_new_tokens))
    if temperature < 0:
        raise ValueError(_("temperature must be >= 0, got {t}").format(t=temperature))
    if top_k is not None and top_k < 1:
        raise ValueError(_("top_k must be >= 1, got {k}").format(k=top_k))
    if limit is not None and ids.size(1) > limit:
        raise ValueError(_("the prompt has {n} tokens but max_tokens={limit}; keep its last {limit} tokens")
                         .format(n=ids.size(1), limit=limit))


def generate(
    model: nn.Module,
    ids: torch.Tensor,
    max_new_tokens: int,
    *,
    use_cache: bool = True,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    threads: int | None = 1,
) -> torch.Tensor:
    """Extend ids ``[B, T]`` by up to ``max_new_tokens`` tokens -> ``[B, T + n]``.

    ``use_cache=True``: one prefill over the prompt, then one decode step per token that computes
    q/k/v for the new token only. ``use_cache=False``: recompute the whole prefix every step (the
    slow reference). ``temperature=0`` is greedy; ``top_k`` keeps the k most likely tokens.
    With learned positions generation stops at the model's ``max_tokens`` (the rows of its position
    table) with a warning that says so. Other positions (sinusoidal, RoPE, ALiBi, none) have no such
    row limit: ``max_tokens`` is then the length the model was trained on, not a bound. A model with a
    sliding window (``config.window``) decodes with a :class:`tinytf.RollingKVCache`, whose memory
    stays at ``window`` tokens however long the generation runs; with RoPE or ALiBi it can generate
    past ``max_tokens`` with flat memory.

    ``threads``: the CPU intra-op threads for the call, **1 by default**. A decode step is a few dozen tiny ops; on
    more threads they wait for each other, and on a busy machine far longer (chapter 13 and ``benchmarks/decode_threads.py``
    measure it). ``None`` keeps torch's setting (a big model or a long prompt,
    whose matrix products are large enough to share). On a GPU it changes nothing that matters.
    """
    window = model.config.window
    limit = model.config.max_tokens if model.config.positions == "learned" else None
    _check_request(ids, max_new_tokens, temperature, top_k, limit)
    n = max_new_tokens if limit is None else min(max_new_tokens, limit - ids.size(1))
    if n < max_new_tokens:
        why = (_(" (the rolling cache bounds memory to window={window} tokens, not positions: the learned position table has "
                 "{limit} rows; positions='rope' or 'alibi' have no such limit).").format(window=window, limit=limit)
               if window is not None else _("."))
        warnings.warn(_("generate: stopping after {n} new tokens instead of {asked}: the prompt ({prompt}) plus new tokens reach "
                        "the model's max_tokens={limit}{why}").format(n=n, asked=max_new_tokens, prompt=ids.size(1), limit=limit,
                                                                       why=why), stacklevel=2)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), intra_op_threads(threads):
            t0 = ids.size(1)
            out = torch.empty(ids.size(0), t0 + n, dtype=ids.dtype, device=ids.device)  # [B, T + n], filled in place
            out[:, :t0] = ids
            if use_cache and n > 0:
                cache = cache_for(model, ids.size(0), max_tokens=t0 + n)
                logits = model(ids, cache=cache)[:, -1]  # prefill: [B, V]
                for i in range(n):
                    nxt = sample_next(logits, temperature, top_k, generator)  # [B, 1]
                    out[:, t0 + i : t0 + i + 1] = nxt
                    if i + 1 < n:
                        logits = model(nxt, cache=cache)[:, -1]  # decode one token
            elif not use_cache:
                for i in range(n):
                    logits = model(out[:, : t0 + i])[:, -1]  # recompute the whole prefix
                    out[:, t0 + i : t0 + i + 1] = sample_next(logits, temperature, top_k, generator)
        return out
    finally:
        model.train(was_training)
