"""Diagnoses of ALiBi's bias and of a left-padded batch's positions (chapter 13).

- ``diagnose_alibi(fn)``: ``fn(heads, t_q, t_k) -> [heads, t_q, t_k]``, ``bias[h, i, j] = -m_h · (p_i - j)`` with the
  query at ``p_i = t_k - t_q + i`` (end-aligned, as a decode step over a cache) and ``m_h = 2^(-8(h+1)/H)`` (``H`` a
  power of two). Names the bias with the wrong sign, aligned to the start, slopes reversed or off by one head.
- ``diagnose_padded_positions(fn)``: ``fn(lengths, t) -> [B, t]`` position ids of a left-padded batch (``lengths[b]``
  real tokens at the end of row ``b``): each row's real tokens numbered 0, 1, 2 … (the pads' ids are not checked).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ..alibi import alibi_bias, alibi_slopes
from ..masks import padded_positions, padding_mask
from ..translation import N_
from ..translation import gettext as _
from .catalog import Pitfall
from .findings import Finding, found
from .probe import cover_probes, crash_finding, is_close, max_abs_diff, only_for, quietly

__all__ = ["diagnose_alibi", "diagnose_padded_positions", "reference_alibi"]


def reference_alibi(heads: int, t_q: int, t_k: int, *, sign: float = 1.0, start_aligned: bool = False,
                    slopes: torch.Tensor | None = None) -> torch.Tensor:
    """``[heads, t_q, t_k]``: ``-m_h · (p_i - j)`` (the defaults), or a named wrong one (``sign=-1``, queries at ``0 … t_q - 1``,
    other ``slopes``)."""
    q_pos = torch.arange(t_q) + (0 if start_aligned else t_k - t_q)
    m = alibi_slopes(heads) if slopes is None else slopes
    return sign * alibi_bias(m, q_pos, torch.arange(t_k))


class WrongAlibi(NamedTuple):
    kwargs: Callable[[int], dict]  # heads -> keywords of reference_alibi
    title: str
    evidence: str


_WRONG_ALIBI = (
    WrongAlibi(lambda h: {"sign": -1.0}, N_("the bias rewards distance"),
               N_("bias[h, i, j] = +m_h · (p_i - j): the farther the key, the higher its score. ALiBi subtracts."),),
    WrongAlibi(lambda h: {"start_aligned": True}, N_("the bias is aligned to the start"),
               N_("query i is treated as position i; with t_k > t_q (new tokens over a cache) it sits at t_k - t_q + i, so a "
                  "decode step's penalties are those of position 0.")),
    WrongAlibi(lambda h: {"slopes": alibi_slopes(h).flip(0)}, N_("the slopes run the wrong way"),
               N_("head 0 gets the shallowest slope 2^-8 and the last head the steepest: m_h = 2^(-8(h+1)/H) starts steep.")),
    WrongAlibi(lambda h: {"slopes": torch.tensor([2.0 ** (-8 * i / h) for i in range(h)])}, N_("the slopes start one head early"),
               N_("m_h = 2^(-8h/H) gives head 0 a slope of 1: the sequence starts at 2^(-8/H).")),
    WrongAlibi(lambda h: {"slopes": torch.tensor([2.0 ** -(i + 1) for i in range(h)])}, N_("the slopes ignore the number of heads"),
               N_("m_h = 2^-(h+1) is the rule for 8 heads only; with H heads it is 2^(-8(h+1)/H).")),
)

_ALIBI_PROBES = ((4, 5, 5), (8, 3, 7), (2, 1, 6), (16, 4, 9), (1, 2, 2))


def _alibi_where(p: tuple[int, int, int]) -> str:
    return _("for heads={}, t_q={}, t_k={}").format(*p)


@quietly
def diagnose_alibi(fn: Callable[[int, int, int], torch.Tensor]) -> list[Finding]:
    """Diagnose ``fn(heads, t_q, t_k) -> bias [heads, t_q, t_k]`` (float; end-aligned, ``-m_h · (p_i - j)``). Names
    ``ALIBI_BIAS`` with what is wrong (sign, alignment, slopes), from the probes that show it. Keys after the query
    are not compared: a causal mask removes them."""
    outs = {}
    for p in _ALIBI_PROBES:
        try:
            out = fn(*p)
        except Exception as exc:  # noqa: BLE001 - student code may raise anything
            return [crash_finding(_("the ALiBi bias {where}").format(where=_alibi_where(p)), exc)]
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != p or not out.is_floating_point():
            got = f"{out.dtype} {list(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
            return [found(Pitfall.GENERAL, _("the ALiBi bias has the wrong shape or dtype"),
                          _("expected a float tensor {want}, got {got}.").format(want=list(p), got=got),
                          fix=_("return [heads, t_q, t_k] floats: one bias per head, query and key"))]
        seen = reference_alibi(*p) > float("-inf")  # every entry; the causal part is what counts
        causal = torch.ones(p[1], p[2], dtype=torch.bool).tril(diagonal=p[2] - p[1]).expand(p[0], -1, -1) & seen
        outs[p] = (out.detach().float(), causal)

    def close(p: tuple[int, int, int], ref: torch.Tensor) -> bool:
        out, causal = outs[p]
        return is_close(out[causal], ref[causal], 1e-5)

    bad = [p for p in outs if not close(p, reference_alibi(*p))]
    if not bad:
        return []
    named, rest = cover_probes(bad, _WRONG_ALIBI, lambda w, p: close(p, reference_alibi(*p, **w.kwargs(p[0]))))
    findings = []
    for w, probes in named:
        where = only_for([_alibi_where(p) for p in probes], len(probes), len(outs)) or _("Seen {where}.").format(
            where=_alibi_where(probes[0]))
        findings.append(found(Pitfall.ALIBI_BIAS, _(w.title), _(w.evidence), where=where))
    if rest:
        p = rest[0]
        out, causal = outs[p]
        findings.append(found(Pitfall.ALIBI_BIAS, _("the ALiBi bias differs"),
                              _("it differs by up to {err:.3g} on the keys a query may see, {where}.").format(
                                  err=max_abs_diff(out[causal], reference_alibi(*p)[causal]), where=_alibi_where(p)),
                              where=only_for([_alibi_where(q) for q in rest], len(rest), len(outs))))
    return findings


@quietly
def diagnose_padded_positions(fn: Callable[[list[int], int], torch.Tensor]) -> list[Finding]:
    """Diagnose ``fn(lengths, t) -> [B, t]`` integer position ids of a left-padded batch: row ``b``'s real tokens (its
    last ``lengths[b]``) numbered ``0 … lengths[b] - 1``. Names ``LEFT_PAD_OFFSET`` (positions counted from the pads) and
    an off-by-one start."""
    for lengths, t in (([5, 3, 1], 5), ([2, 6], 6), ([4], 4)):
        where = _("Seen for lengths={lengths}, t={t}.").format(lengths=lengths, t=t)
        try:
            out = fn(list(lengths), t)
        except Exception as exc:  # noqa: BLE001
            return [crash_finding(_("the position ids for lengths={lengths}, t={t}").format(lengths=lengths, t=t), exc)]
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (len(lengths), t) or out.is_floating_point():
            got = f"{out.dtype} {list(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
            return [found(Pitfall.GENERAL, _("the position ids have the wrong shape or dtype"),
                          _("expected integers [B, t] = {want}, got {got}. {where}").format(want=[len(lengths), t], got=got, where=where),
                          fix=_("return one integer position per token: a LongTensor [B, t]"))]
        real = padding_mask(lengths, t, side="left")[:, 0, 0, :]
        right = padded_positions(lengths, t)
        got = out.cpu().long()
        if torch.equal(got[real], right[real]):
            continue
        if torch.equal(got[real], torch.arange(t).expand(len(lengths), t)[real]):
            return [found(Pitfall.LEFT_PAD_OFFSET, _("the positions are counted from the pads"),
                          _("the first real token of a row with {pads} pads gets position {pads}, not 0: every row is numbered "
                            "0 … t - 1 whatever its padding.").format(pads=t - min(lengths)), where=where)]
        if torch.equal(got[real], right[real] + 1):
            return [found(Pitfall.GENERAL, _("the positions start at 1"),
                          _("each row's first real token gets position 1."), where=where,
                          fix=_("count from 0: cumsum(real) - 1"))]
        return [found(Pitfall.LEFT_PAD_OFFSET, _("the real tokens get the wrong positions"),
                      _("row positions of the real tokens: {got}, should be {right}.").format(
                          got=got[0][real[0]].tolist(), right=right[0][real[0]].tolist()), where=where)]
    return []
