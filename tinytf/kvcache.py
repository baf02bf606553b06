"""A static KV cache: preallocated key/value buffers per layer, written in place.

    k, v buffers: [layers, B, kv_heads, max_tokens, d_head];  lengths[layer] = tokens written so far.

A grouped-query model (``kv_heads < heads``) stores only its ``kv_heads`` K/V heads: the cache is
``heads / kv_heads`` times smaller. A sliding-window model generates with a
:class:`tinytf.RollingKVCache` instead (a subclass), which keeps only the last ``window`` tokens;
:func:`tinytf.cache_for` picks the one a model needs.

No ``torch.cat`` per decode step: memory is allocated once, the way static caches in serving
engines work, and each step writes its new k/v at the write position.
"""

from __future__ import annotations

import torch

from .translation import gettext
from .translation import gettext as _

__all__ = ["KVCache"]


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
                raise ValueError(_("KVCache: {name} must be positive, got {val}").format(name=name, val=val))
        shape = (layers, batch, heads, max_tokens, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._k_layers, self._v_layers = self.k.unbind(0), self.v.unbind(0)  # views [B, H, max_tokens, d_head]
        self.lengths = [0] * layers

    @classmethod
    def for_model(cls, model: torch.nn.Module, batch: int, *, max_tokens: int | None = None) -> KVCache:
        """A cache sized by ``model.config`` (a :class:`tinytf.ModelConfig`: layers, K/V heads, head width,
        ``max_tokens`` unless given) in the dtype and on the device of the model's weights."""
        c, p = model.config, next(model.parameters())
        return cls(c.layers, batch, c.n_kv_heads, max_tokens or c.max_tokens, c.head_dim, dtype=p.dtype, device=p.device)

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
            raise ValueError(gettext("{name} has {n_lengths} layers, got layer={layer}")
                .format(name=name, n_lengths=len(self.lengths), layer=layer))
        _, b, h, _, d = self.k.shape
        if k.shape != v.shape or k.dim() != 4 or (k.size(0), k.size(1), k.size(3)) != (b, h, d):
            raise ValueError(
                gettext("{name} expects k and v of shape [B={b}, kv_heads={h}, t, d_head={d}], got k {k_shape}, v {v_shape}. Build the "
                        "cache with the model's batch size, kv_heads and head width ({name}.for_model(model, batch) reads them from the "
                        "model).").format(name=name, b=b, h=h, d=d, k_shape=list(k.shape), v_shape=list(v.shape))
            )
        if k.dtype != self.k.dtype or k.device != self.k.device:
            raise ValueError(
                gettext("{name} holds {k_dtype} on {k_device} but got k/v {k_dtype2} on {k_device2}. Build the cache after moving the "
                        "model: {name}.for_model(model, batch) copies its dtype and device.")
                            .format(name=name, k_dtype=self.k.dtype, k_device=self.k.device, k_dtype2=k.dtype, k_device2=k.device)
            )

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new k/v ``[B, h, t, d_head]`` for ``layer``; return all cached ``[B, h, past + t, d_head]`` (h = kv_heads)."""
        self._check(layer, k, v)
        cap = self.max_tokens
        past, t = self.lengths[layer], k.size(2)
        if past + t > cap:
            raise ValueError(
                _("KV cache overflow at layer {layer}: it holds {cap} tokens, {past} are written and {t} more were asked for. Create the "
                  "cache with max_tokens >= {value} or start a new one.").format(layer=layer, cap=cap, past=past, t=t, value=past + t)
            )
        k_buf, v_buf = self._k_layers[layer], self._v_layers[layer]
        k_buf.narrow(2, past, t).copy_(k)  # in place at the write position: no reallocation per step
        v_buf.narrow(2, past, t).copy_(v)
        self.lengths[layer] = past + t
        return k_buf.narrow(2, 0, past + t), v_buf.narrow(2, 0, past + t)  # views, no copy

    def key_positions(self, layer: int, t: int, device: torch.device | str | None = None) -> torch.Tensor:
        """The absolute position of each key the last :meth:`update` of ``layer`` (with ``t`` new tokens) returned,
        ``[Tk]`` (int64): ``0 … lengths[layer] - 1`` here, in time order. What a bias by distance (ALiBi) needs."""
        return torch.arange(self.lengths[layer], device=device)

    def __repr__(self) -> str:
        layers, b, h, cap, d = self.shape
        return f"KVCache(layers={layers}, B={b}, kv_heads={h}, max_tokens={cap}, d_head={d}, seen={self.seen}, dtype={self.k.dtype})"
