"""A static KV cache: preallocated key/value buffers per layer, written in place.

    k, v buffers: [layers, B, kv_heads, max_tokens, d_head];  lengths[layer] = tokens written so far.

A grouped-query model (``kv_heads < heads``) stores only its ``kv_heads`` K/V heads: the cache is
``heads / kv_heads`` times smaller. A sliding-window model generates with a
:class:`tinytf.RollingKVCache` instead, which keeps only the last ``window`` tokens.

No ``torch.cat`` per decode step: memory is allocated once, the way static caches in serving
engines work, and each step writes its new k/v at the write position.
"""

from __future__ import annotations

import warnings

import torch

__all__ = ["KVCache", "generate"]


class KVCache:
    """Per-layer key/value buffers ``[B, kv_heads, max_tokens, d_head]`` with a write position per layer.

    ``heads`` is the number of K/V heads stored: the model's ``kv_heads`` (its ``heads`` for
    multi-head attention)."""

    def __init__(
        self,
        layers: int,
        batch: int,
        heads: int,
        max_tokens: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        for name, val in (("layers", layers), ("batch", batch), ("heads", heads), ("max_tokens", max_tokens), ("head_dim", head_dim)):
            if val < 1:
                raise ValueError(f"KVCache: {name} must be positive, got {val}")
        shape = (layers, batch, heads, max_tokens, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._k_layers, self._v_layers = self.k.unbind(0), self.v.unbind(0)  # views [B, H, max_tokens, d_head]
        self.lengths = [0] * layers

    @classmethod
    def for_model(cls, model, batch: int, *, max_tokens: int | None = None) -> KVCache:
        """A cache sized for a :class:`tinytf.TinyLanguageModel` (dtype and device of its weights)."""
        p = next(model.parameters())
        attn = model.blocks[0].attn
        return cls(len(model.blocks), batch, attn.kv_heads, max_tokens or model.max_tokens, attn.head_dim, dtype=p.dtype,
                   device=p.device)

    @property
    def shape(self) -> tuple[int, ...]:
        """``(layers, B, kv_heads, max_tokens, d_head)``."""
        return tuple(self.k.shape)

    @property
    def max_tokens(self) -> int:
        """Capacity in tokens per layer."""
        return self.k.size(3)

    @property
    def seen(self) -> int:
        """Tokens written to every layer (the absolute position of the next token)."""
        return min(self.lengths)

    def nbytes(self) -> int:
        """Bytes held by both buffers (allocated capacity, not just the filled part)."""
        return self.k.numel() * self.k.element_size() * 2

    def reset(self) -> None:
        """Forget every token (the buffers are kept and simply overwritten by the next prefill)."""
        self.lengths = [0] * len(self.lengths)

    def _check(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """``ValueError`` unless ``layer`` exists and k/v ``[B, kv_heads, t, d_head]`` fit the buffers (dtype, device too)."""
        name = type(self).__name__
        if not 0 <= layer < len(self.lengths):
            raise ValueError(f"{name} has {len(self.lengths)} layers, got layer={layer}")
        _, b, h, _, d = self.k.shape
        if k.shape != v.shape or k.dim() != 4 or (k.size(0), k.size(1), k.size(3)) != (b, h, d):
            raise ValueError(
                f"{name} expects k and v of shape [B={b}, kv_heads={h}, t, d_head={d}], got k {list(k.shape)}, "
                f"v {list(v.shape)}. Build the cache with the model's batch size, kv_heads and head width "
                f"({name}.for_model(model, batch) reads them from the model)."
            )
        if k.dtype != self.k.dtype or k.device != self.k.device:
            raise ValueError(
                f"{name} holds {self.k.dtype} on {self.k.device} but got k/v {k.dtype} on {k.device}. "
                f"Build the cache after moving the model: {name}.for_model(model, batch) copies its dtype and device."
            )

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new k/v ``[B, h, t, d_head]`` for ``layer``; return all cached ``[B, h, past + t, d_head]`` (h = kv_heads)."""
        self._check(layer, k, v)
        cap = self.max_tokens
        past, t = self.lengths[layer], k.size(2)
        if past + t > cap:
            raise ValueError(
                f"KV cache overflow at layer {layer}: it holds {cap} tokens, {past} are written and "
                f"{t} more were asked for. Create the cache with max_tokens >= {past + t} or start a new one."
            )
        k_buf, v_buf = self._k_layers[layer], self._v_layers[layer]
        k_buf.narrow(2, past, t).copy_(k)  # in place at the write position: no reallocation per step
        v_buf.narrow(2, past, t).copy_(v)
        self.lengths[layer] = past + t
        return k_buf.narrow(2, 0, past + t), v_buf.narrow(2, 0, past + t)  # views, no copy

    def __repr__(self) -> str:
        layers, b, h, cap, d = self.shape
        return f"KVCache(layers={layers}, B={b}, kv_heads={h}, max_tokens={cap}, d_head={d}, seen={self.seen}, dtype={self.k.dtype})"


@torch.inference_mode()
def _next_token(logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None) -> torch.Tensor:
    """logits ``[B, V]`` -> next ids ``[B, 1]``; greedy when temperature == 0."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator)


def generate(
    model,
    ids: torch.Tensor,
    max_new_tokens: int,
    *,
    use_cache: bool = True,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Extend ids ``[B, T]`` by up to ``max_new_tokens`` tokens -> ``[B, T + n]``.

    ``use_cache=True``: one prefill over the prompt, then one decode step per token that computes
    q/k/v for the new token only. ``use_cache=False``: recompute the whole prefix every step (the
    slow reference). ``temperature=0`` is greedy; ``top_k`` keeps the k most likely tokens.
    Generation stops at the model's ``max_tokens`` with a warning that says so. A model with a
    sliding window (``config.window``) decodes with a :class:`tinytf.RollingKVCache`: its memory
    stays at ``window`` tokens, but the learned position table still has ``max_tokens`` rows, so the
    same limit holds (a model with relative positions, such as RoPE, would not have it).
    """
    if ids.dim() != 2:
        raise ValueError(f"generate expects ids [B, T], got shape {list(ids.shape)} (add a batch axis with ids[None])")
    if ids.size(1) == 0:
        raise ValueError(f"generate needs a prompt of at least one token, got ids of shape {list(ids.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    limit = model.max_tokens
    if ids.size(1) > limit:
        raise ValueError(f"the prompt has {ids.size(1)} tokens but max_tokens={limit}; keep its last {limit} tokens")
    n = min(max_new_tokens, limit - ids.size(1))
    window = getattr(getattr(model, "config", None), "window", None)
    if n < max_new_tokens:
        warnings.warn(
            f"generate: stopping after {n} new tokens instead of {max_new_tokens}: the prompt "
            f"({ids.size(1)}) plus new tokens reach the model's max_tokens={limit}"
            + (f" (the rolling cache bounds memory to window={window} tokens, not positions: the learned position "
               f"table has {limit} rows)." if window is not None else "."),
            stacklevel=2,
        )
    from .rolling import RollingKVCache  # a subclass of KVCache: imported here, not at module level

    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            t0 = ids.size(1)
            out = torch.empty(ids.size(0), t0 + n, dtype=ids.dtype, device=ids.device)  # [B, T + n], filled in place
            out[:, :t0] = ids
            if use_cache and n > 0:
                cache = (KVCache.for_model(model, ids.size(0), max_tokens=t0 + n) if window is None
                         else RollingKVCache.for_model(model, ids.size(0)))
                logits = model(ids, cache=cache)[:, -1]  # prefill: [B, V]
                for i in range(n):
                    nxt = _next_token(logits, temperature, top_k, generator)  # [B, 1]
                    out[:, t0 + i : t0 + i + 1] = nxt
                    if i + 1 < n:
                        logits = model(nxt, cache=cache)[:, -1]  # decode one token
            elif not use_cache:
                for i in range(n):
                    logits = model(out[:, : t0 + i])[:, -1]  # recompute the whole prefix
                    out[:, t0 + i : t0 + i + 1] = _next_token(logits, temperature, top_k, generator)
        return out
    finally:
        model.train(was_training)
