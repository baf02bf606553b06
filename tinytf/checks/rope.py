"""Diagnoses of rotary positions (chapter 13): the rotation itself and its use in a cached decode step.

- ``diagnose_rope(fn)``: ``fn(x [B, H, T, d], positions [T]) -> [B, H, T, d]``, the half-split rotation of
  :mod:`tinytf.rope` with base 10000. Probed at small and at large positions (4090 …), so that angles computed in
  bf16/fp16 — right near 0, whole radians off at 4096 — are told apart from the interleaved layout, a rotation the
  wrong way, and positions ignored.
- ``diagnose_rope_decode(fn)``: ``fn(q, k, v, k_cache, v_cache, past) -> (out, k_cache, v_cache)`` for ``t`` new tokens
  after ``past`` cached ones: q, k, v ``[B, H, t, d]`` as projected (not rotated), the caches ``[B, H, past, d]`` holding
  rotated keys; the new keys rotated at ``past …`` and appended, v never rotated, causal attention end-aligned.
  Names v rotated, the step rotated at position 0, the cached keys rotated again, keys cached unrotated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from ..attention import scaled_dot_product_attention
from ..rope import apply_rope, rope_frequencies
from ..translation import N_
from ..translation import gettext as _
from .catalog import Pitfall
from .findings import Finding, found
from .probe import cover_probes, crash_finding, is_close, max_abs_diff, only_for, quietly

__all__ = ["diagnose_rope", "diagnose_rope_decode", "reference_rope", "reference_rope_decode"]


def reference_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0, *, layout: str = "half",
                   angle_dtype: torch.dtype = torch.float32, sign: float = 1.0, exponent: float = 2.0) -> torch.Tensor:
    """tinytf's rotation of ``x [..., T, d]`` at ``positions [T]`` (the defaults), or one of the named wrong ones:
    another ``layout``, angles in ``angle_dtype``, the other direction (``sign=-1``), θ_i = base^(-i/d) (``exponent=1``)."""
    d = x.size(-1)
    theta = rope_frequencies(d, base)[0] if exponent == 2.0 else 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / 2 / d)
    angles = (positions.to(angle_dtype)[:, None] * theta.to(angle_dtype)).float() * sign  # [T, d/2]
    angles = torch.cat([angles, angles], -1) if layout == "half" else angles.repeat_interleave(2, -1)
    return apply_rope(x, angles.cos(), angles.sin(), layout)


class RopeProbe(NamedTuple):
    shape: tuple[int, int, int, int]  # B, H, T, d
    start: int  # positions start … start + T - 1

    def where(self) -> str:
        b, h, t, d = self.shape
        return _("for x [{b}, {h}, {t}, {d}] at positions {start} … {end}").format(b=b, h=h, t=t, d=d, start=self.start,
                                                                                  end=self.start + t - 1)

    @property
    def tol(self) -> float:
        """A float32 angle near 8192 is only good to ~5e-4 rad, however it is computed: a looser tolerance there."""
        return 1e-4 if self.start < 100 else 2e-2


_ROPE_PROBES = (RopeProbe((2, 3, 5, 8), 0), RopeProbe((1, 2, 6, 16), 3), RopeProbe((2, 2, 4, 32), 4090), RopeProbe((1, 4, 3, 64), 8187))


class WrongRope(NamedTuple):
    kwargs: dict
    pitfall: Pitfall
    title: str
    evidence: str


_WRONG_ROPE = (
    WrongRope({"layout": "interleaved"}, Pitfall.ROPE_LAYOUT, N_("the rotation pairs channels (2i, 2i + 1), not (i, i + d/2)"),
              N_("the output is the interleaved layout's (RoFormer, GPT-J): rotate_half pairs channel i with channel i + d/2.")),
    WrongRope({"angle_dtype": torch.bfloat16}, Pitfall.LOW_PRECISION_ANGLES, N_("the angles are computed in bfloat16"),
              N_("small errors near position 0, large ones far away: position · θ in bfloat16 keeps 8 bits, whole radians off at "
                 "4096.")),
    WrongRope({"angle_dtype": torch.float16}, Pitfall.LOW_PRECISION_ANGLES, N_("the angles are computed in float16"),
              N_("small errors near position 0, large ones far away: position · θ in float16 is a radian off at 4096.")),
    WrongRope({"sign": -1.0}, Pitfall.GENERAL, N_("the rotation turns the wrong way"),
              N_("every pair turns by -position · θ: q·k still depends on m - n only, but weights trained the usual way see "
                 "every offset mirrored.")),
    WrongRope({"exponent": 1.0}, Pitfall.GENERAL, N_("the frequencies are θ_i = base^(-i/d)"),
              N_("pair i must turn at θ_i = base^(-2i/d): the exponent counts channels (2i), not pairs.")),
)


def _rope_fixes(w: WrongRope) -> bool | str:
    if w.pitfall is Pitfall.GENERAL:
        return _("the angle of pair i is position · base^(-2i/d), positive, in float32")
    return True


@quietly
def diagnose_rope(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> list[Finding]:
    """Diagnose ``fn(x, positions) -> x rotated`` (half-split layout, base 10000, angles in float32). Names
    ``ROPE_LAYOUT``, ``LOW_PRECISION_ANGLES``, ``DECODE_AT_ZERO`` (the given positions ignored) and general mistakes,
    from the probes on which each wrong rotation matches."""
    gen = torch.Generator().manual_seed(1301)
    outs: dict[RopeProbe, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    for p in _ROPE_PROBES:
        x = torch.randn(*p.shape, generator=gen)
        positions = torch.arange(p.start, p.start + p.shape[2])
        try:
            out = fn(x.clone(), positions.clone())
        except Exception as exc:  # noqa: BLE001 - student code may raise anything
            return [crash_finding(_("the rotation {where}").format(where=p.where()), exc)]
        if not isinstance(out, torch.Tensor) or out.shape != x.shape:
            got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            return [found(Pitfall.GENERAL, _("the rotation returns the wrong shape"),
                          _("expected {want} (the shape of x), got {got} {where}.").format(want=list(x.shape), got=got, where=p.where()),
                          fix=_("rotate pairs of channels in place of x: x · cos + rotate_half(x) · sin"))]
        outs[p] = (x, positions, out.detach().float())
    bad = [p for p, (x, pos, out) in outs.items() if not is_close(out, reference_rope(x, pos), p.tol)]
    if not bad:
        return []
    at_zero = WrongRope({}, Pitfall.DECODE_AT_ZERO, N_("the rotation ignores the given positions"),
                        N_("every sequence is rotated at 0, 1, 2 … whatever positions it is given: a decode step after a cache "
                           "would be rotated at 0."))

    def matches(w: WrongRope, p: RopeProbe) -> bool:
        x, pos, out = outs[p]
        ref = reference_rope(x, torch.arange(pos.numel())) if w is at_zero else reference_rope(x, pos, **w.kwargs)
        return is_close(out, ref, p.tol)

    named, rest = cover_probes(bad, (*_WRONG_ROPE, at_zero), matches)
    findings = []
    for w, probes in named:
        where = only_for([p.where() for p in probes], len(probes), len(outs)) or _("Seen {where}.").format(where=probes[0].where())
        findings.append(found(w.pitfall, _(w.title), _(w.evidence), where=where, fix=_rope_fixes(w)))
    if rest:
        p = rest[0]
        x, pos, out = outs[p]
        err = {q: max_abs_diff(outs[q][2], reference_rope(outs[q][0], outs[q][1])) for q in outs}
        near = max(e for q, e in err.items() if q.start < 100)
        far = max(e for q, e in err.items() if q.start >= 100)
        low = near < 0.1 and far > 10 * max(near, 1e-4)  # fine near 0, off far away: the angles lost precision
        findings.append(found(Pitfall.LOW_PRECISION_ANGLES if low else Pitfall.GENERAL,
                              _("the rotation differs from RoPE's"),
                              _("the output differs by up to {near:.3g} at positions below 100 and {far:.3g} at positions above "
                                "4000 ({where}).").format(near=near, far=far, where=p.where()),
                              where=only_for([q.where() for q in rest], len(rest), len(outs)),
                              fix=True if low else _("x · cos(position · θ) + rotate_half(x) · sin(position · θ), "
                                                     "θ_i = base^(-2i/d), cos and sin laid out [φ, φ]")))
    return findings


def reference_rope_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          past: int, *, q_at: int | None = None, k_at: int | None = None, rotate_v: bool = False,
                          again: bool = False, store_raw: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The right cached step (defaults) or a named wrong one: q or the new k rotated at ``q_at``/``k_at`` instead of
    ``past``, v rotated too, every key rotated ``again`` at 0 … T-1 after appending, or keys cached unrotated."""
    t = q.size(-2)
    at = lambda start: torch.arange(start, start + t)  # noqa: E731
    q_r = reference_rope(q, at(past if q_at is None else q_at))
    k_r = reference_rope(k, at(past if k_at is None else k_at))
    v_new = reference_rope(v, at(past)) if rotate_v else v
    keys = torch.cat([k_cache, k_r], dim=-2)
    values = torch.cat([v_cache, v_new], dim=-2)
    seen = reference_rope(keys, torch.arange(keys.size(-2))) if again else keys
    mask = torch.ones(t, keys.size(-2), dtype=torch.bool).tril(diagonal=past)  # end-aligned causal
    out = scaled_dot_product_attention(q_r, seen, values, mask)
    return out, torch.cat([k_cache, k], dim=-2) if store_raw else keys, values


class WrongDecode(NamedTuple):
    kwargs: dict
    pitfall: Pitfall
    title: str
    evidence: str


_WRONG_DECODE = (
    WrongDecode({"rotate_v": True}, Pitfall.ROPE_ON_V, N_("v is rotated too"),
                N_("the output mixes rotated values: RoPE turns q and k so that q·k sees their offset; v carries content.")),
    WrongDecode({"q_at": 0, "k_at": 0}, Pitfall.DECODE_AT_ZERO, N_("the new tokens are rotated at position 0"),
                N_("the query and key of the step are rotated at 0 … t-1 instead of past … past + t - 1: their offset to the "
                   "cached keys is wrong by past.")),
    WrongDecode({"q_at": 0}, Pitfall.DECODE_AT_ZERO, N_("the query is rotated at position 0"),
                N_("the new key is rotated at past, the query at 0 … t-1: the query sees every cached key past positions away "
                   "from where it is.")),
    WrongDecode({"again": True}, Pitfall.KEYS_ROTATED_TWICE, N_("the cached keys are rotated again"),
                N_("keys already rotated before caching are rotated once more at their positions when read: key p turns by "
                   "2p · θ.")),
)


def _decode_probe(fn: Callable, b: int, h: int, t: int, d: int, past: int, gen: torch.Generator) -> tuple | Finding:
    q, k, v = (torch.randn(b, h, t, d, generator=gen) for _ in range(3))
    k_cache = reference_rope(torch.randn(b, h, past, d, generator=gen), torch.arange(past))  # rotated when they were cached
    v_cache = torch.randn(b, h, past, d, generator=gen)
    res = fn(q.clone(), k.clone(), v.clone(), k_cache.clone(), v_cache.clone(), past)
    where = _("Seen for t={t} new tokens after past={past} (q [{b}, {h}, {t}, {d}]).").format(t=t, past=past, b=b, h=h, d=d)
    if not (isinstance(res, (tuple, list)) and len(res) == 3 and all(isinstance(r, torch.Tensor) for r in res)):
        return found(Pitfall.GENERAL, _("the decode step returns the wrong thing"),
                     _("expected (out, k_cache, v_cache), got {got}. {where}").format(got=type(res).__name__, where=where),
                     fix=_("return the output and the two caches with the new keys and values appended"))
    return (q, k, v, k_cache, v_cache, past), [r.detach().float() for r in res], where


@quietly
def diagnose_rope_decode(fn: Callable) -> list[Finding]:
    """Diagnose a cached RoPE step ``fn(q, k, v, k_cache, v_cache, past) -> (out, k_cache, v_cache)``. Names
    ``ROPE_ON_V``, ``DECODE_AT_ZERO``, ``KEYS_ROTATED_TWICE`` (keys rotated again, or cached before rotation) and
    ``CAUSAL_OFF_BY_ONE`` (a prefill of several tokens without the end-aligned causal mask)."""
    gen = torch.Generator().manual_seed(1302)
    shapes = ((2, 2, 1, 8, 5), (1, 3, 1, 16, 9), (2, 2, 3, 8, 4), (1, 2, 1, 8, 0))
    for shape in shapes:
        try:
            probe = _decode_probe(fn, *shape, gen)
        except Exception as exc:  # noqa: BLE001
            return [crash_finding(_("the decode step for t={t}, past={past}").format(t=shape[2], past=shape[4]), exc)]
        if isinstance(probe, Finding):
            return [probe]
        args, (out, k_new, v_new), where = probe
        right = reference_rope_decode(*args)
        if is_close(out, right[0]) and is_close(k_new, right[1]) and is_close(v_new, right[2]):
            continue
        for w in _WRONG_DECODE:
            if args[-1] > 0 or w.pitfall is Pitfall.ROPE_ON_V:  # at past = 0 a step at 0 is right
                wrong = reference_rope_decode(*args, **w.kwargs)
                if is_close(out, wrong[0]):
                    return [found(w.pitfall, _(w.title), _(w.evidence), where=where)]
        if is_close(out, right[0]) and is_close(k_new, reference_rope_decode(*args, store_raw=True)[1]):
            return [found(Pitfall.KEYS_ROTATED_TWICE, _("the keys are cached before they are rotated"),
                          _("the output is right, but the returned cache holds the keys as projected: the next step would "
                            "have to rotate them again, and a step that reads them as rotated keys is wrong."), where=where)]
        if shape[2] > 1 and is_close(out, scaled_dot_product_attention(
                reference_rope(args[0], torch.arange(args[-1], args[-1] + shape[2])), right[1], right[2])):
            return [found(Pitfall.CAUSAL_OFF_BY_ONE, _("the new tokens see each other's future"),
                          _("with t > 1 new tokens each must see the cache and the new tokens up to itself: an end-aligned "
                            "causal mask."), where=where, fix=_("mask with causal_mask(t, past + t), aligned to the end"))]
        return [found(Pitfall.GENERAL, _("the decode step differs from RoPE attention over the cache"),
                      _("out differs by up to {err:.3g}. {where}").format(err=max_abs_diff(out, right[0]) if out.shape == right[0].shape
                                                                         else math.inf, where=where),
                      fix=_("rotate q and the new k at past …, append k and v, attend with an end-aligned causal mask"))]
    return []
