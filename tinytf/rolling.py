"""A rolling-buffer KV cache for sliding-window attention: only the last ``window`` tokens are kept.

    k, v buffers: [layers, B, kv_heads, window, d_head];  token at position p lives in slot p % window

Under a window of W every query sees at most the last W keys, itself included, so older keys can be
overwritten: the cache's memory stays at W tokens however long the generation runs. Positions keep
counting (``seen``), so the position embedding of each new token is still its absolute position.

A decode step (one token) gets the buffer itself back, in *ring order* (slot order, not time order):
its one query sees every key the buffer holds, and attention does not depend on the order of the
keys, only on which keys there are. A prefill of several tokens gets the kept tokens unrolled into
time order followed by the new ones, for the end-aligned window mask of :func:`tinytf.causal_mask`.
"""

from __future__ import annotations

import torch

from .config import check_window
from .kvcache import KVCache
from .translation import gettext as _

__all__ = ["RollingKVCache"]


class RollingKVCache(KVCache):
    """Per-layer ring buffers ``[B, kv_heads, window, d_head]``; ``lengths[layer]`` counts every token written.

    A :class:`tinytf.KVCache` whose buffers hold ``window`` tokens (``max_tokens`` is the window) and
    whose :meth:`update` overwrites the oldest slot instead of overflowing."""

    def __init__(
        self,
        layers: int,
        batch: int,
        heads: int,
        window: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        """``heads`` is the number of K/V heads stored (the model's ``kv_heads``)."""
        self.window = check_window(window)
        super().__init__(layers, batch, heads, self.window, head_dim, dtype=dtype, device=device)

    @classmethod
    def for_model(cls, model: torch.nn.Module, batch: int) -> RollingKVCache:  # type: ignore[override]
        """A cache of ``model.config.window`` tokens, sized by ``model.config`` (a :class:`tinytf.ModelConfig`),
        in the dtype and on the device of the model's weights."""
        c = model.config
        if c.window is None:
            raise ValueError(
                _("RollingKVCache.for_model needs a model with a sliding window (ModelConfig.window); this one attends "
                "over every earlier token, so dropping old keys would change its output. Use KVCache.for_model.")
            )
        p = next(model.parameters())
        return cls(c.layers, batch, c.n_kv_heads, c.window, c.head_dim, dtype=p.dtype, device=p.device)

    def _in_time_order(self, buf: torch.Tensor, past: int) -> torch.Tensor:
        """The kept tokens of one layer's buffer ``[B, h, min(past, W), d]``, oldest first."""
        w = self.window
        if past <= w:
            return buf.narrow(2, 0, past)
        start = past % w  # slot of the oldest kept token
        return torch.cat([buf[:, :, start:], buf[:, :, :start]], dim=2)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new k/v ``[B, h, t, d_head]`` for ``layer`` and return the keys/values to attend over.

        ``t == 1``: the buffer itself (views ``[B, h, min(past + 1, W), d]``, ring order). ``t > 1``: the
        kept tokens in time order, then the new ones (``[B, h, min(past, W) + t, d]``, a fresh tensor);
        only the last ``W`` new tokens stay in the buffer.
        """
        self._check(layer, k, v)  # KVCache's checks: layer, shapes, dtype, device
        past, t, w = self.lengths[layer], k.size(2), self.window
        k_buf, v_buf = self._k_layers[layer], self._v_layers[layer]
        if t == 1:
            k_buf.narrow(2, past % w, 1).copy_(k)  # overwrite the oldest slot once the ring is full
            v_buf.narrow(2, past % w, 1).copy_(v)
            self.lengths[layer] = past + 1
            n = min(past + 1, w)
            return k_buf.narrow(2, 0, n), v_buf.narrow(2, 0, n)
        k_all = torch.cat([self._in_time_order(k_buf, past), k], dim=2)
        v_all = torch.cat([self._in_time_order(v_buf, past), v], dim=2)
        keep = min(t, w)
        slots = torch.arange(past + t - keep, past + t, device=k.device) % w  # ring slots of the last `keep` tokens
        k_buf.index_copy_(2, slots, k[:, :, t - keep :])
        v_buf.index_copy_(2, slots, v[:, :, t - keep :])
        self.lengths[layer] = past + t
        return k_all, v_all

    def key_positions(self, layer: int, t: int, device: torch.device | str | None = None) -> torch.Tensor:
        """The absolute position of each key the last :meth:`update` of ``layer`` (``t`` new tokens) returned, ``[Tk]``:
        for a decode step (``t == 1``) in ring order — slot ``s`` holds the latest position ``p <= seen - 1`` with
        ``p % W == s`` —, for a prefill the kept tokens then the new ones, in time order."""
        seen, w = self.lengths[layer], self.window
        if t == 1:
            slots = torch.arange(min(seen, w), device=device)
            return (seen - 1) - (seen - 1 - slots) % w
        past = seen - t
        return torch.arange(past - min(past, w), seen, device=device)

    def __repr__(self) -> str:
        layers, b, h, w, d = self.shape
        return f"RollingKVCache(layers={layers}, B={b}, kv_heads={h}, window={w}, d_head={d}, seen={self.seen}, dtype={self.k.dtype})"
