"""Diagnoses of hand-written tiled attention (chapter 10): the online softmax update, the tiled forward
and causal tile skipping, each probed on inputs chosen so that every classic mistake shows.

- ``diagnose_online_softmax(fn)``: ``fn(m, l, acc, scores, v) -> (m, l, acc)``, folded over key tiles
  whose row maximum sits in the first tile, then grows tile after tile, then with fully masked tiles.
- ``diagnose_tiled_attention(fn)``: ``fn(q, k, v, mask=None, *, block_q, block_k) -> out``, on one tile,
  on several tiles (maximum first, maximum growing), ``T`` not a multiple of the block, ``Tq != Tk``,
  padding, left padding and rows that may see nothing; and its measured peak memory.
- ``diagnose_causal_tiles(fn)``: ``fn(q, k, v, *, block_q, block_k) -> (out, tiles_computed)``, causal
  with ``Tq == Tk`` and ``Tk > Tq``: which keys each query reads, and how many tiles it computed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..memory_meters import PeakMemoryMeter
from ..memory_sizes import attention_matrix_bytes
from ..translation import gettext
from ..translation import gettext as _
from .catalog import Pitfall
from .findings import Finding, found
from .probe import crash_finding, error_text, is_close, max_abs_diff, quietly
from .tiled_probes import TiledProbe, empty_rows, left_padding, ordered_qkv, reference

__all__ = ["diagnose_online_softmax", "diagnose_tiled_attention"]

NEG_INF = float("-inf")
# (B, H, Tq, Tk, d, dv), (block_q, block_k): Tq != Tk and T not a multiple of the blocks
_SHAPES = (((2, 2, 7, 11, 8, 5), (3, 4)), ((1, 3, 9, 9, 4, 6), (4, 2)), ((2, 1, 5, 13, 6, 3), (2, 5)))


def _fold(fn: Callable, scores: torch.Tensor, v: torch.Tensor, block_k: int) -> tuple[torch.Tensor, ...]:
    """Run ``fn`` over the key tiles of ``scores [B, bq, Tk]`` / ``v [B, Tk, dv]``; ``(m, l, acc, out)``."""
    b, bq, tk = scores.shape
    m, l, acc = torch.full((b, bq, 1), NEG_INF), torch.zeros(b, bq, 1), torch.zeros(b, bq, v.size(-1))
    for k0 in range(0, tk, block_k):
        m, l, acc = fn(m, l, acc, scores[..., k0:k0 + block_k].clone(), v[:, k0:k0 + block_k].clone())
    return m, l, acc, acc / l.masked_fill(l == 0, 1.0)


def _update_probes(gen: torch.Generator) -> dict[str, tuple[torch.Tensor, torch.Tensor, int]]:
    """``{kind: (scores [B, bq, Tk], v [B, Tk, dv], block_k)}``: maximum first, growing, masked tiles."""
    probes = {}
    for order in ("falling", "rising"):
        q, k, v = ordered_qkv((2, 1, 5, 10, 4, 3), gen, order)
        probes[order] = ((q @ k.transpose(-2, -1) / 2.0)[:, 0], v[:, 0], 3)
    s, v = torch.randn(2, 4, 9, generator=gen), torch.randn(2, 9, 3, generator=gen)
    s[:, :, :3] = NEG_INF  # the first tile is masked for every row: m is still -inf when the next tile comes
    s[:, 1, :] = NEG_INF  # and row 1 may see nothing at all
    probes["masked"] = (s, v, 3)
    return probes


@quietly
def diagnose_online_softmax(fn: Callable) -> list[Finding]:
    """Diagnose ``fn(m, l, acc, scores, v) -> (m_new, l_new, acc_new)``: m, l ``[..., bq, 1]``, acc
    ``[..., bq, dv]``, scores ``[..., bq, bk]`` (``-inf`` where masked), v ``[..., bk, dv]``. Folded over
    the key tiles, ``acc / l`` must be the softmax-weighted average of v. Names ``ACC_NOT_RESCALED``
    (right while the maximum stays in the first tile, wrong once it grows) and ``MASKED_TILE_NAN``."""
    probes = _update_probes(torch.Generator().manual_seed(915))
    results = {}
    for kind, (s, v, bk) in probes.items():
        try:
            results[kind] = _fold(fn, s, v, bk)
        except Exception as exc:  # noqa: BLE001 - student code may raise anything
            return [crash_finding(gettext("the online softmax update on scores {s_shape}").format(s_shape=list(s.shape)), exc)]
        m, l, acc, _ = results[kind]
        if not all(isinstance(t, torch.Tensor) for t in (m, l, acc)) or acc.shape != (*s.shape[:-1], v.size(-1)):
            return [found(Pitfall.GENERAL, gettext("the update returns the wrong thing"), gettext("got acc {acc}.").format(acc=_shape(acc)),
                          fix=gettext("return (m [..., bq, 1], l [..., bq, 1], acc [..., bq, dv])"))]
    want = {kind: torch.softmax(s, dim=-1).nan_to_num(0.0) @ v for kind, (s, v, _) in probes.items()}
    ok = {kind: is_close(results[kind][3], want[kind]) for kind in probes}
    where = gettext("(scores [2, 5, 10] folded in key tiles of 3)")
    if not ok["falling"]:
        return [found(Pitfall.GENERAL, gettext("the online softmax is wrong even when the maximum never changes"),
                      gettext("with each row's maximum in the first tile, acc / l after the last tile differs from softmax(scores) @ v "
                              "by up to {max_abs_diff:.3g} {where}.")
                      .format(max_abs_diff=max_abs_diff(results['falling'][3], want['falling']), where=where),
                      fix=gettext("m is the running maximum, l the running sum of exp(scores - m), acc the running sum of "
                                  "exp(scores - m) @ v"))]
    if not ok["rising"]:
        return [found(Pitfall.ACC_NOT_RESCALED, gettext("the running sums are not rescaled when the maximum grows"),
                      gettext("right while each row's maximum sits in the first tile, wrong (by up to {max_abs_diff:.3g}) when every "
                              "later tile raises it {where}: {which_unscaled} must shrink by exp(m - m_new).")
                                  .format(max_abs_diff=max_abs_diff(results['rising'][3], want['rising']), where=where,
                                      which_unscaled=_which_unscaled(results['rising'], probes['rising'][0])))]
    m, l, acc, out = results["masked"]
    if not (torch.isfinite(out).all() and torch.isfinite(l).all()):
        return [found(Pitfall.MASKED_TILE_NAN, gettext("NaN after a fully masked tile"),
                      gettext("when a row's first tile is all -inf its maximum is still -inf, and exp(-inf - -inf) is NaN; "
                      "the rows then stay NaN (scores [2, 4, 9] with keys 0-2 masked, row 1 masked everywhere)."))]
    if not ok["masked"]:
        return [found(Pitfall.MASK, gettext("a masked tile changes the result"),
                      gettext("a score of -inf must get the weight exp(-inf) = 0 (scores [2, 4, 9] with keys 0-2 masked)."),
                      fix=gettext("p = exp(s - m_new) with the -inf scores kept as they are, so masked keys add 0 to l and acc; a row "
                                  "that saw only masked keys keeps l = 0, acc = 0"))]
    return []


def _which_unscaled(res: tuple[torch.Tensor, ...], scores: torch.Tensor) -> str:
    """"acc", "l" or "acc and l": which running sum is not the rescaled one after the last tile."""
    m, l, acc, _ = res
    l_ok = is_close(l, torch.exp(scores - m).sum(-1, keepdim=True), 1e-3) if m.shape == l.shape else False
    return gettext("acc (l is right)") if l_ok else gettext("l and acc")


def _shape(x: object) -> str:
    return str(list(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


def _probes(gen: torch.Generator) -> list[TiledProbe]:
    """One-tile, maximum-first, maximum-growing and random probes of every shape."""
    out = []
    for shape, (bq, bk) in _SHAPES:
        for kind in ("one tile", "falling", "rising", "random"):
            q, k, v = ordered_qkv(shape, gen, "random" if kind == "one tile" else kind)
            blocks = (shape[2], shape[3]) if kind == "one tile" else (bq, bk)
            out.append(TiledProbe(q, k, v, None, *blocks, kind))
    return out


def _masked_probes(gen: torch.Generator) -> list[TiledProbe]:
    out = []
    for (b, h, tq, tk, d, dv), (bq, bk) in _SHAPES:
        q, k, v = ordered_qkv((b, h, tq, tk, d, dv), gen, "random")
        lengths = torch.randint(1, tk, (b,), generator=gen)
        pad = torch.arange(tk)[None, :] < lengths[:, None]
        out += [TiledProbe(q, k, v, pad[:, None, None, :], bq, bk, "padding"),
                TiledProbe(q, k, v, left_padding(b, tk, bk + 1), bq, bk, "left padding"),
                TiledProbe(q, k, v, empty_rows(b, tq, tk, gen), bq, bk, "empty rows")]
    return out


def _call(fn: Callable, p: TiledProbe) -> torch.Tensor:
    args = (p.q.clone(), p.k.clone(), p.v.clone())
    out = fn(*args, p.mask.clone(), block_q=p.block_q, block_k=p.block_k) if p.mask is not None else \
        fn(*args, block_q=p.block_q, block_k=p.block_k)
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        out = out[0]
    return out


def _ones_rows(fn: Callable, p: TiledProbe) -> bool:
    """With v = ones every output row must be ones (each row's weights sum to one)."""
    ones = TiledProbe(p.q, p.k, torch.ones_like(p.v), p.mask, p.block_q, p.block_k, p.kind)
    try:
        out = _call(fn, ones)
    except Exception:  # noqa: BLE001
        return True  # nothing to say from this probe
    return isinstance(out, torch.Tensor) and is_close(out, torch.ones_like(out))


def _name_unmasked(fn: Callable, ran: list[tuple[TiledProbe, torch.Tensor]]) -> list[Finding]:
    """Name the mistake behind wrong unmasked outputs: the division by l (forgotten on one tile, per tile on
    several), the missing rescaling (right while the maximum is in the first tile) or none of them."""
    bad = {kind: [(p, o) for p, o in ran if p.kind == kind and not is_close(o, reference(p))] for kind in
           ("one tile", "falling", "rising", "random")}
    if bad["one tile"]:
        p, o = bad["one tile"][0]
        if not _ones_rows(fn, p):
            return [found(Pitfall.NO_FINAL_DIVISION, _("the output is not divided by l"),
                          _("with a single key tile and v = ones every output row should be ones; yours are the unnormalised "
                          "sums acc = Σ exp(s - m) v."), where=_("Seen {p_where}.").format(p_where=p.where()))]
        return [_differs(p, o, _("even with one tile, where no online softmax is needed"))]
    if bad["falling"]:
        p, o = bad["falling"][0]
        if not _ones_rows(fn, p):
            return [found(Pitfall.NO_FINAL_DIVISION, _("the output is divided by l per tile"),
                          _("right with one key tile, wrong with several even though the maximum never grows: with v = ones the "
                          "rows are not ones. Dividing inside the loop mixes normalised and unnormalised sums."),
                          where=_("Seen {p_where}.").format(p_where=p.where()))]
        return [_differs(p, o, _("with several key tiles although each row's maximum is in the first one"))]
    if bad["rising"]:
        p, o = bad["rising"][0]
        return [found(Pitfall.ACC_NOT_RESCALED, _("the running sums are not rescaled when the maximum grows"),
                      _("right while each row's maximum sits in the first key tile, wrong (by up to {max_abs_diff:.3g}) when every later "
                        "tile raises it.")
                            .format(max_abs_diff=max_abs_diff(o, reference(p))), where=_("Seen {p_where}.").format(p_where=p.where()))]
    if bad["random"]:
        return [_differs(*bad["random"][0], _("on random inputs"))]
    return []


def _differs(p: TiledProbe, out: torch.Tensor, when: str) -> Finding:
    return found(Pitfall.GENERAL, _("tiled attention differs from softmax(q kᵀ / sqrt(d)) v"),
                 _("{when}, by up to {max_abs_diff:.3g} {p_where}.").format(when=when, max_abs_diff=max_abs_diff(out, reference(p)),
                                                                             p_where=p.where()),
                 fix=_("compare each query block with tinytf.scaled_dot_product_attention, one key tile at a time"))


def _name_masked(fn: Callable, gen: torch.Generator) -> list[Finding]:
    """Padding, left padding (the first key tile fully masked) and rows that may see nothing."""
    for p in _masked_probes(gen):
        try:
            out = _call(fn, p)
        except Exception as exc:  # noqa: BLE001
            return [crash_finding(_("tiled attention with a mask {mask_shape}").format(mask_shape=list(p.mask.shape)), exc, Pitfall.MASK,
                           _("fn(q, k, v, mask, block_q=..., block_k=...) takes a bool mask broadcastable to [B, H, Tq, Tk]."))]
        if not isinstance(out, torch.Tensor) or out.shape != reference(p).shape:
            return [found(Pitfall.ORIENTATION, _("wrong output shape with a mask"), _("expected {reference}, got {out} {p_where}.")
                          .format(reference=list(reference(p).shape), out=_shape(out), p_where=p.where()),
                          fix=_("the mask broadcasts over the scores [B, H, Tq, Tk]: slice it per tile, mask[..., q0:q1, k0:k1], "
                                "and keep out [B, H, Tq, dv]"))]
        if not torch.isfinite(out).all():
            why = (_("its first key tile is entirely masked, so m is still -inf and exp(-inf - -inf) = NaN")
                   if p.kind == "left padding" else _("a row that may see nothing ends with l = 0 and acc / l = 0 / 0"))
            return [found(Pitfall.MASKED_TILE_NAN, _("NaN from a fully masked tile or row"), f"{why}.", where=_("Seen {p_where}.")
                .format(p_where=p.where()))]
        if not is_close(out, reference(p)):
            empty = p.kind == "empty rows" and not is_close(out[..., ::3, :], torch.zeros_like(out[..., ::3, :]))
            what = _("rows that may see nothing must be zeros") if empty else _("masked keys must get exactly zero weight")
            return [found(Pitfall.MASK, _("masked tiled attention differs from the reference"), _("{what}.").format(what=what),
                          where=_("Seen {p_where}.").format(p_where=p.where()),
                          fix=_("mask each tile's scores with -inf before the update: s.masked_fill(~mask[..., q0:q1, k0:k1], -inf)"))]
    return []


def _memory(fn: Callable, gen: torch.Generator) -> list[Finding]:
    """Measured peak bytes of a forward at T = 512 against one [B, H, T, T] float32 score matrix."""
    b, h, t, d, block = 1, 2, 512, 16, 64
    q, k, v = (torch.randn(b, h, t, d, generator=gen) for _ in range(3))
    with torch.no_grad(), PeakMemoryMeter("cpu") as meter:
        fn(q, k, v, block_q=block, block_k=block)
    scores = attention_matrix_bytes(b, h, t, torch.float32)
    if meter.peak >= scores // 4:
        return [found(Pitfall.EXPLICIT_IN_PRODUCTION, gettext("the tiled forward holds the whole score matrix"),
                      gettext("its measured peak is {meter_peak} bytes for q, k, v [{b}, {h}, {t}, {d}] with {block} × {block} tiles, "
                              "{value:.2f}× one [B, H, T, T] float32 score matrix ({scores} bytes); a tile is {value2} bytes.")
                      .format(meter_peak=meter.peak, b=b, h=h, t=t, d=d, block=block, value=meter.peak / scores,
                              scores=scores, value2=b * h * block * block * 4),
                      fix=gettext("compute the scores q_i @ k_jᵀ per tile inside the loop, never q @ kᵀ for the whole sequence"))]
    return []


@quietly
def diagnose_tiled_attention(fn: Callable) -> list[Finding]:
    """Diagnose ``fn(q, k, v, mask=None, *, block_q, block_k) -> out``: q ``[B, H, Tq, d]``, k ``[B, H, Tk, d]``,
    v ``[B, H, Tk, dv]``, out ``[B, H, Tq, dv]``; mask bool, True = may attend; a row that may see nothing
    gives zeros. Names ``NO_FINAL_DIVISION``, ``ACC_NOT_RESCALED``, ``MASKED_TILE_NAN``, mask mistakes, and
    ``EXPLICIT_IN_PRODUCTION`` when the measured peak memory shows the full score matrix."""
    gen = torch.Generator().manual_seed(916)
    ran = []
    for p in _probes(gen):
        try:
            out = _call(fn, p)
        except Exception as exc:  # noqa: BLE001
            multiple = p.q.size(-2) % p.block_q == 0 and p.k.size(-2) % p.block_k == 0
            hint = "" if multiple else _("Tq or Tk is not a multiple of the block: the last tile is smaller (slice to min(k0 + block_k, "
                                         "Tk)).")
            return [crash_finding(_("tiled attention {p_where}").format(p_where=p.where()), exc, Pitfall.GENERAL, hint)]
        if not isinstance(out, torch.Tensor) or out.shape != reference(p).shape:
            return [found(Pitfall.ORIENTATION, _("wrong output shape"), _("expected {reference} = [B, H, Tq, dv], got {out} {p_where}.")
                          .format(reference=list(reference(p).shape), out=_shape(out), p_where=p.where()),
                          fix=_("write each query tile's acc / l into out[..., q0:q1, :], out of shape [B, H, Tq, dv]"))]
        ran.append((p, out))
    findings = _name_unmasked(fn, ran) or _name_masked(fn, gen)
    if findings:
        return findings
    try:
        return _memory(fn, gen)  # right numbers: is the memory that of tiles?
    except Exception as exc:  # noqa: BLE001
        return [Finding(Pitfall.GENERAL, _("tiled attention fails at T = 512"), _("it raised {error_text}.")
            .format(error_text=error_text(exc)))]
