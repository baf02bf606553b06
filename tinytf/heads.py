"""Multi-head attention: one fused projection, split into heads, attend, merge, project.

    x [B, T, D] --qkv--> [B, T, 3D] --chunk--> q, k, v [B, T, D]
      --split--> [B, H, T, d_head] --attention--> [B, H, T, d_head] --merge--> [B, T, D] --proj-->

With ``kv_heads < heads`` (grouped-query; 1 = multi-query, see :mod:`tinytf.grouped`) the same fused
projection is narrower: ``[B, T, D + 2·kv_heads·d_head]`` splits into q ``[B, H, T, d]`` and
k, v ``[B, kv_heads, T, d]``, and query head ``h`` reads K/V head ``h // (heads // kv_heads)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .alibi import alibi_bias, alibi_slopes, allowed_keys
from .attention import check_mask, scaled_dot_product_attention
from .config import ModelConfig, module_config
from .grouped import repeat_kv
from .masks import causal_mask
from .rolling import RollingKVCache
from .rope import RotaryEmbedding
from .tiled import tiled_attention
from .translation import gettext as _

if TYPE_CHECKING:  # pragma: no cover
    from .kvcache import KVCache

__all__ = ["MultiHeadAttention", "CausalSelfAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head (self- or cross-) attention with a fused ``qkv`` projection and ``proj`` output.

    ``qkv.weight`` is ``[3D, D]`` laid out as ``[W_q; W_k; W_v]`` — the same packing as
    ``nn.MultiheadAttention.in_proj_weight`` — so weights copy across directly. With
    ``kv_heads`` K/V heads (a divisor of ``heads``; None = ``heads``) it is
    ``[D + 2·kv_heads·d_head, D]``, the same packing with narrower ``W_k`` and ``W_v``.
    ``backend="explicit"`` runs :func:`tinytf.scaled_dot_product_attention`; ``backend="sdpa"``
    runs PyTorch's fused ``F.scaled_dot_product_attention``; ``backend="tiled"`` runs
    :func:`tinytf.tiled_attention` (the online softmax, tile by tile; no attention dropout). All
    three give the same result.

    Built from a :class:`tinytf.ModelConfig` (``MultiHeadAttention(config)``: its ``dim``, ``heads``,
    ``kv_heads``, ``bias``, ``dropout``, ``backend``) or from those values directly
    (``MultiHeadAttention(64, 4, backend="sdpa")``), which the config validates.
    """

    def __init__(
        self,
        dim: int | ModelConfig,
        heads: int | None = None,
        *,
        kv_heads: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        backend: str = "explicit",
    ) -> None:
        super().__init__()
        c = module_config(MultiHeadAttention.__init__, dim, dict(heads=heads, kv_heads=kv_heads, bias=bias, dropout=dropout,
                                                                  backend=backend))
        self.dim, self.heads, self.head_dim = c.dim, c.heads, c.head_dim
        self.kv_heads = c.n_kv_heads
        self.groups = c.heads // self.kv_heads  # query heads per K/V head
        self.kv_dim = self.kv_heads * self.head_dim  # width of k and of v
        self.backend = c.backend
        self.dropout = c.dropout
        self.qkv = nn.Linear(c.dim, c.dim + 2 * self.kv_dim, bias=c.bias)  # [W_q; W_k; W_v]: D + kv_dim + kv_dim rows
        self.proj = nn.Linear(c.dim, c.dim, bias=c.bias)
        self.attn_drop = nn.Dropout(c.dropout)

    # -- shape helpers -------------------------------------------------------------------------
    def split_heads(self, z: torch.Tensor) -> torch.Tensor:
        """``[B, T, n·d_head] -> [B, n, T, d_head]`` (n = H for queries, kv_heads for keys and values)."""
        b, t, width = z.shape
        return z.view(b, t, width // self.head_dim, self.head_dim).transpose(1, 2)  # [B, T, n, d] -> [B, n, T, d]

    def merge_heads(self, z: torch.Tensor) -> torch.Tensor:
        """``[B, H, T, d_head] -> [B, T, D]`` (transpose makes it non-contiguous, so reshape)."""
        b, _, t, _ = z.shape
        return z.transpose(1, 2).reshape(b, t, self.dim)  # [B, H, T, d] -> [B, T, H, d] -> [B, T, D]

    def _check_input(self, x: torch.Tensor, name: str = "x") -> None:
        if x.dim() != 3 or x.size(-1) != self.dim:
            raise ValueError(
                _("{name} must be [B, T, D] with D={dim}, got shape {x_shape}").format(name=name, dim=self.dim, x_shape=list(x.shape))
                + (_(" (add a batch axis with x[None])") if x.dim() == 2 and x.size(-1) == self.dim else "")
            )

    def project(self, x: torch.Tensor, context: torch.Tensor | None = None):
        """q ``[B, H, T, d_head]``, k, v ``[B, kv_heads, T, d_head]``; with ``context`` k/v come from it."""
        sizes = [self.dim, self.kv_dim, self.kv_dim]
        if context is None:
            q, k, v = self.qkv(x).split(sizes, dim=-1)  # [B, T, D + 2·kv_dim] -> [B, T, D], 2 x [B, T, kv_dim]
        else:
            w_q, w_kv = self.qkv.weight.split([self.dim, 2 * self.kv_dim])  # [D, D], [2·kv_dim, D]
            b_q, b_kv = (None, None) if self.qkv.bias is None else self.qkv.bias.split([self.dim, 2 * self.kv_dim])
            q = F.linear(x, w_q, b_q)  # [B, Tq, D]
            k, v = F.linear(context, w_kv, b_kv).chunk(2, dim=-1)  # 2 x [B, Tk, kv_dim]
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        is_causal: bool,
        return_weights: bool = False,
        bias: torch.Tensor | None = None,
    ):
        """Attention over heads: q ``[B, H, Tq, d]``, k/v ``[B, kv_heads, Tk, d]`` -> ``[B, H, Tq, d]``.

        The fused kernel shares the K/V heads itself (``enable_gqa``); the explicit and the tiled
        attention get them repeated once per query head (:func:`tinytf.grouped.repeat_kv`). ``bias`` (float,
        broadcastable to ``[B, H, Tq, Tk]``, e.g. ALiBi's) is added to the scores; the tiled attention takes none."""
        p = self.dropout if self.training else 0.0
        if return_weights and self.backend != "explicit":
            raise ValueError(
                _("return_weights=True needs backend='explicit' (backend={backend!r} never forms the [B, H, Tq, Tk] weights)")
                    .format(backend=self.backend)
            )
        if self.backend == "tiled":
            if p > 0.0:
                raise ValueError(
                    _("backend='tiled' has no dropout on the attention weights (dropout={dropout}, training mode): call model.eval(), "
                      "set dropout=0.0, or train with backend='sdpa' or 'explicit'.").format(dropout=self.dropout)
                )
            return tiled_attention(q, repeat_kv(k, self.groups), repeat_kv(v, self.groups), mask, is_causal=is_causal)
        if self.backend == "sdpa":
            t_q, t_k = q.size(-2), k.size(-2)
            if is_causal and (mask is not None or t_q != t_k):
                # F.sdpa's is_causal is start-aligned and cannot be combined with a mask:
                # hand it the end-aligned causal mask explicitly.
                causal = causal_mask(t_q, t_k, device=q.device)
                mask = causal if mask is None else mask & causal
                is_causal = False
            if bias is not None:  # one float attn_mask: the bias where allowed, -inf where blocked
                bias = bias.to(q.dtype)
                mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal, enable_gqa=self.groups > 1
            )
        k, v = repeat_kv(k, self.groups), repeat_kv(v, self.groups)  # [B, H, Tk, d]
        out, weights = scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal, return_weights=True, bias=bias)
        if p > 0.0:
            weights = self.attn_drop(weights)
            out = weights @ v
        return (out, weights) if return_weights else out

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        *,
        return_weights: bool = False,
    ):
        """x ``[B, Tq, D]``; context ``[B, Tk, D]`` or None (self-attention).

        mask: bool broadcastable to ``[B, H, Tq, Tk]`` (True = may attend), e.g. ``[Tq, Tk]`` or a
        padding mask ``[B, 1, 1, Tk]``. Returns ``[B, Tq, D]`` (and weights ``[B, H, Tq, Tk]``).
        """
        self._check_input(x)
        if context is not None:
            self._check_input(context, "context")
            if context.size(0) != x.size(0):
                raise ValueError(_("x {x_shape} and context {context_shape} must share the batch size B")
                    .format(x_shape=list(x.shape), context_shape=list(context.shape)))
        q, k, v = self.project(x, context)
        if mask is not None:
            check_mask(mask, (x.size(0), self.heads, q.size(-2), k.size(-2)))
        res = self.attend(q, k, v, mask, is_causal, return_weights)
        if return_weights:
            out, weights = res
            return self.proj(self.merge_heads(out)), weights
        return self.proj(self.merge_heads(res))


class CausalSelfAttention(MultiHeadAttention):
    """Decoder self-attention: ``qkv`` + ``proj``, a causal mask, at most ``max_tokens`` positions.

    With a :class:`tinytf.KVCache` the forward computes q/k/v for the new tokens only, writes their
    k/v into the cache and attends over everything cached (an end-aligned causal mask). A decode
    step of one token with no extra mask uses the fused kernel whatever the backend (same math).
    ``bias=False`` builds ``qkv`` and ``proj`` without bias vectors; ``kv_heads`` as in
    :class:`MultiHeadAttention`. ``window``: each query sees at most the last ``window`` keys, itself
    included (:func:`tinytf.causal_mask`); such a layer also runs with a :class:`tinytf.RollingKVCache`
    of the same window, which keeps only ``window`` tokens.

    ``CausalSelfAttention(config)`` reads ``max_tokens``, ``window`` and ``positions`` from the config too. With
    ``positions="rope"`` q and k are rotated at their absolute positions (:class:`tinytf.rope.RotaryEmbedding`) —
    the keys *before* they are cached, a decode step's query at ``past``; with ``"alibi"`` each head's scores get
    ``-m_h · distance`` (:mod:`tinytf.alibi`). The other choices act on the model's input, not here. ``max_tokens``
    limits a sequence only for learned positions.
    """

    def __init__(
        self,
        dim: int | ModelConfig,
        heads: int | None = None,
        max_tokens: int | None = None,
        *,
        kv_heads: int | None = None,
        window: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        backend: str = "explicit",
    ) -> None:
        c = module_config(CausalSelfAttention.__init__, dim, dict(heads=heads, max_tokens=max_tokens, kv_heads=kv_heads,
                                                                   window=window, bias=bias, dropout=dropout, backend=backend))
        super().__init__(c)
        self.max_tokens = c.max_tokens
        self.window = c.window
        self.positions = c.positions
        self.rope = RotaryEmbedding(c) if c.positions == "rope" else None
        self.alibi_slopes = alibi_slopes(c.heads) if c.positions == "alibi" else None  # float32 [H], not a parameter

    def _check_cache(self, cache: KVCache | None, layer: int, x: torch.Tensor, mask: torch.Tensor | None) -> None:
        """``ValueError`` if x's tokens exceed ``max_tokens`` or the cache does not suit this layer."""
        past, t = (0 if cache is None else cache.lengths[layer]), x.size(1)
        if past + t > self.max_tokens and self.positions == "learned":
            raise ValueError(
                (_("sequence of {n} tokens (x {x_shape} after {past} cached) is longer than max_tokens={max_tokens}. ") if past else
                 _("sequence of {n} tokens (x {x_shape}) is longer than max_tokens={max_tokens}. ")).format(
                    n=past + t, x_shape=list(x.shape), past=past, max_tokens=self.max_tokens)
                + _("Truncate the input to the last {max_tokens} tokens or build the model with a larger max_tokens.")
                .format(max_tokens=self.max_tokens)
            )
        if not isinstance(cache, RollingKVCache):
            return
        if cache.window != self.window:
            raise ValueError(
                _("a RollingKVCache of window={cache_window} needs attention with the same window, but this layer has window={window}. "
                  "Build the cache with RollingKVCache.for_model(model, batch).").format(cache_window=cache.window, window=self.window)
            )
        if mask is not None:
            raise ValueError(
                _("a RollingKVCache keeps keys in ring order, so an extra mask (e.g. padding [B, 1, 1, Tk]) cannot be "
                "lined up with them. Generate unpadded batches, or use a KVCache with the window mask.")
            )

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        cache: KVCache | None = None,
        layer: int = 0,
        return_weights: bool = False,
        positions: torch.Tensor | None = None,
    ):
        """x ``[B, T, D]`` -> ``[B, T, D]``. ``mask`` (optional, e.g. padding ``[B, 1, 1, Tk]``) is
        combined with the causal (and window) mask. With ``cache``, x holds only the new tokens.
        ``positions`` ``[B, T]`` (RoPE and ALiBi; without a cache): each token's position, e.g. counted from the first
        real token of a left-padded sequence; by default ``past … past + T - 1``."""
        self._check_input(x)
        b, t = x.shape[:2]
        self._check_cache(cache, layer, x, mask)
        if positions is not None and cache is not None:
            raise ValueError(_("positions=[B, T] works without a cache; with a cache the positions are counted by it "
                               "(cache.lengths). Generate the sequences of a left-padded batch one by one, or without the cache."))
        past = 0 if cache is None else cache.lengths[layer]
        q, k, v = self.project(x)  # q [B, H, T, d_head], k, v [B, kv_heads, T, d_head]
        if self.rope is not None:  # keys rotated at their absolute positions BEFORE they are cached; a decode query at `past`
            q, k = self.rope(q, k, start=past, positions=positions)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # [B, kv_heads, Tk, d_head]: the cached keys, then the new ones
        t_k = k.size(-2)
        if mask is not None:
            check_mask(mask, (b, self.heads, t, t_k))
        if self.alibi_slopes is not None:
            res = self._alibi_attend(q, k, v, mask, cache, layer, positions, return_weights)
        else:
            res = self._causal_attend(q, k, v, mask, cache, return_weights)
        if return_weights:
            out, weights = res
            return self.proj(self.merge_heads(out)), weights
        return self.proj(self.merge_heads(res))

    def _causal_attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                       cache: KVCache | None, return_weights: bool):
        """Causal (and windowed) attention of q ``[B, H, T, d]`` over k, v ``[B, kv_heads, Tk, d]``."""
        t, t_k = q.size(-2), k.size(-2)
        if self.window is not None and t_k > self.window:  # the newest query alone sees t_k keys causally
            # some query has keys older than the window: mask them out
            band = causal_mask(t, t_k, window=self.window, device=q.device)  # [T, Tk], end-aligned
            mask = band if mask is None else mask & band
        # One query (a decode step) is the newest token: the end-aligned causal mask (within the window)
        # lets it see every key it is given, so no mask is built or applied on the hot decode path.
        if cache is not None and t == 1 and mask is None and not return_weights and not (self.training and self.dropout > 0):
            # Decode fast path, whatever the backend: softmax(q kᵀ / sqrt(d)) v for one query is the same
            # math in the fused kernel, in one call instead of several ops per layer and token.
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=self.groups > 1)
        return self.attend(q, k, v, mask, t > 1, return_weights)

    def _alibi_attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                      cache: KVCache | None, layer: int, positions: torch.Tensor | None, return_weights: bool):
        """ALiBi: the scores get ``-m_h · (p_i - p_j)`` from the absolute positions of queries and keys (the cache's
        keys may come in ring order: :meth:`tinytf.KVCache.key_positions` says where each one is)."""
        t = q.size(-2)
        past = 0 if cache is None else cache.lengths[layer] - t
        q_pos = torch.arange(past, past + t, device=q.device) if positions is None else positions  # [T] or [B, T]
        k_pos = q_pos if cache is None else cache.key_positions(layer, t, device=q.device)  # [Tk] or [B, Tk]
        bias = alibi_bias(self.alibi_slopes, q_pos, k_pos)  # [H, T, Tk] or [B, H, T, Tk], float32
        if bias.dim() == 3:  # [1, H, T, Tk]: PyTorch's fused CPU kernel takes a 4-D float mask, a 3-D one falls back to math
            bias = bias[None]
        if cache is not None and t == 1 and mask is None and not return_weights and not (self.training and self.dropout > 0):
            # decode: every key a cache returns may be seen (within the window), so the bias is the whole attn_mask
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), enable_gqa=self.groups > 1)
        allowed = allowed_keys(q_pos, k_pos, window=self.window).unsqueeze(-3)  # [1, T, Tk] or [B, 1, T, Tk]
        allowed = allowed if allowed.dim() == 4 else allowed[None]  # [1, 1, T, Tk]
        mask = allowed if mask is None else mask & allowed
        return self.attend(q, k, v, mask, False, return_weights, bias=bias)
