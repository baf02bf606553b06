"""Exercise 12 — RoPE, a cached RoPE decode step, ALiBi's bias and a left-padded batch's positions: judges, probes,
self-check.

Student code: ``rope(x, positions, base=10000.0)`` (part A: the half-split rotation, angles in float32),
``rope_decode_step(q, k, v, k_cache, v_cache, past)`` (part B, graded on tinytf's rotation, so a mistake in part A costs
only part A), ``alibi_bias(heads, t_q, t_k)`` and ``position_ids(lengths, t)`` (part C). The hidden tests call the probes
below and hand the result to the judge, in the notebook and again in the grader's clean process. Fresh random shapes, and on
every draw the inputs that expose each of the task's mistakes (:mod:`.mutants.ex12`): positions past 4000 and a bfloat16 x
there (angles in low precision or in x's dtype, a result not cast back), positions that do not start at 0; a decode step
after ``past >= 1`` cached tokens and a chunk of ``t >= 2`` new tokens (the end-aligned mask); ALiBi for 4 heads with
``t_k > t_q`` (slopes reversed, shifted or meant for 8 heads, start alignment), a row of two real tokens after left pads.
The references are :mod:`tinytf.rope`, :mod:`tinytf.alibi`, :func:`tinytf.masks.padded_positions` and
:mod:`tinytf.checks.rope`'s named wrong rotations; :func:`diagnose_tasks` names each mistake through the mutants.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from tinytf.checks import Finding, Pitfall

from ...translation import gettext as _
from . import Probe, check_parts, explained, flat, stub_or, swapped
from .judging import judge
from .validators import close, float_inputs, has_keys, shapes, tensor

__all__ = ["reference_rope", "reference_decode_step", "reference_alibi", "diagnose", "diagnose_tasks", "PROBES"]


def reference_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """tinytf's half-split rotation of ``x [..., T, d]`` at ``positions [T]``, angles in float32."""
    from tinytf.checks.rope import reference_rope as rotate

    return rotate(x, positions, base)


def reference_decode_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          past: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, new k rotated at ``past …``, k and v appended, end-aligned causal attention: ``(out, k_cache, v_cache)``."""
    from tinytf.checks.rope import reference_rope_decode

    return reference_rope_decode(q, k, v, k_cache, v_cache, int(past))


def reference_alibi(heads: int, t_q: int, t_k: int) -> torch.Tensor:
    """``[heads, t_q, t_k]``: ``-m_h · (p_i - j)``, ``p_i = t_k - t_q + i``, ``m_h = 2^(-8(h+1)/heads)``."""
    from tinytf.alibi import alibi_bias, alibi_slopes

    return alibi_bias(alibi_slopes(int(heads)), torch.arange(t_k - t_q, t_k), torch.arange(t_k))


def _named(value: torch.Tensor, x: torch.Tensor, positions: torch.Tensor, tol: float) -> str:
    """The name of the wrong rotation ``value`` is, with its pitfall's label, or ``""``."""
    from tinytf.checks.rope import reference_rope as rotate

    wrong = ((dict(layout="interleaved"), Pitfall.ROPE_LAYOUT, _("the channels are paired (2i, 2i + 1): the interleaved layout")),
             (dict(angle_dtype=torch.bfloat16), Pitfall.LOW_PRECISION_ANGLES, _("the angles are computed in bfloat16")),
             (dict(angle_dtype=torch.float16), Pitfall.LOW_PRECISION_ANGLES, _("the angles are computed in float16")),
             (dict(sign=-1.0), Pitfall.GENERAL, _("the rotation turns the wrong way (angle -position · θ)")))
    for kwargs, pitfall, what in wrong:
        if torch.allclose(value.float(), rotate(x, positions, **kwargs), atol=tol, rtol=tol):
            return f" — {what}" + (f" ({pitfall.label()})" if pitfall is not Pitfall.GENERAL else "")
    if torch.allclose(value.float(), rotate(x, torch.arange(positions.numel())), atol=tol, rtol=tol):
        return _(" — the given positions are ignored (rotated at 0, 1, 2 …: {label})").format(label=Pitfall.DECODE_AT_ZERO.label())
    return ""


# ---- judges ---------------------------------------------------------------------------------------


@judge("ex12_rope")
def _judge_rope(value: Any, near: torch.Tensor, far: torch.Tensor, near_positions: torch.Tensor, far_positions: torch.Tensor,
                half: torch.Tensor | None = None) -> None:
    has_keys(value, ("near", "far"))
    near, far = float_inputs(near, far)
    for key, x, positions, tol in (("near", near, near_positions, 1e-4), ("far", far, far_positions, 2e-2)):
        positions = torch.as_tensor(positions)
        what = _("rope(x, positions) at positions {start} … {end}").format(start=int(positions[0]), end=int(positions[-1]))
        got = tensor(value[key], x.shape, what)
        expected = reference_rope(x, positions)
        if not torch.allclose(got.float(), expected, atol=tol, rtol=tol):
            raise AssertionError(_("{what} differs from RoPE's half-split rotation (x · cos + rotate_half(x) · sin, θ_i = "
                                   "10000^(-2i/d), angles in float32) for {shapes}").format(what=what, shapes=shapes(x=x))
                                 + _named(got, x, positions, tol))
    if half is not None:  # a bfloat16 x far from 0: the angles stay float32 whatever x's dtype, only the result is cast
        _judge_rope_half(value, half, torch.as_tensor(far_positions))


def _judge_rope_half(value: Any, x: torch.Tensor, positions: torch.Tensor) -> None:
    assert isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16, _("{what} are not float tensors").format(
        what=_("the recorded inputs"))
    has_keys(value, ("half",))
    what = _("rope(x, positions) for a bfloat16 x at positions {start} … {end}").format(start=int(positions[0]),
                                                                                       end=int(positions[-1]))
    got = tensor(value["half"], x.shape, what, dtype=None)
    assert got.dtype == torch.bfloat16, _("{what} returns {dtype}: the result has x's dtype (cast cos and sin to x.dtype, "
                                          "after building them in float32)").format(what=what, dtype=got.dtype)
    expected = reference_rope(x.float(), positions)  # float32 all through; a bfloat16 result is within its rounding
    if not torch.allclose(got.float(), expected, atol=5e-2, rtol=3e-2):
        raise AssertionError(_("{what} differs from RoPE's half-split rotation with the angles in float32 for {shapes}").format(
            what=what, shapes=shapes(x=x)) + _named(got, x.float(), positions, 5e-2))


@judge("ex12_decode")
def _judge_decode(value: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  past: int, chunk: dict | None = None) -> None:
    _judge_step(value, q, k, v, k_cache, v_cache, past)
    if chunk is not None:  # several new tokens after a cache: only an end-aligned causal mask gets them right
        has_keys(value, ("chunk",))
        _judge_step(value["chunk"], **chunk)


def _judge_step(value: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                past: int) -> None:
    from tinytf.checks.rope import reference_rope_decode

    has_keys(value, ("out", "k_cache", "v_cache"))
    q, k, v, k_cache, v_cache = float_inputs(q, k, v, k_cache, v_cache)
    past = int(past)
    out, keys, values = reference_decode_step(q, k, v, k_cache, v_cache, past)
    given = shapes(q=q, k_cache=k_cache) + f", past={past}"
    got = tensor(value["out"], out.shape, "out")
    if not torch.allclose(got.float(), out, atol=1e-4, rtol=1e-4):
        hint = ""
        for kwargs, pitfall in ((dict(rotate_v=True), Pitfall.ROPE_ON_V), (dict(q_at=0, k_at=0), Pitfall.DECODE_AT_ZERO),
                                (dict(q_at=0), Pitfall.DECODE_AT_ZERO), (dict(again=True), Pitfall.KEYS_ROTATED_TWICE)):
            if torch.allclose(got.float(), reference_rope_decode(q, k, v, k_cache, v_cache, past, **kwargs)[0], atol=1e-4, rtol=1e-4):
                hint = f" — {pitfall.label()}: {_(pitfall.fix)}"
                break
        raise AssertionError(_("rope_decode_step: out differs from RoPE attention over the cache for {given}").format(given=given)
                             + hint)
    got_k = tensor(value["k_cache"], keys.shape, "k_cache")
    if not torch.allclose(got_k.float(), keys, atol=1e-4, rtol=1e-4):
        raw = torch.cat([k_cache, k], dim=-2)
        hint = f" — {Pitfall.KEYS_ROTATED_TWICE.label()}: {_(Pitfall.KEYS_ROTATED_TWICE.fix)}" if torch.allclose(got_k.float(), raw) else ""
        raise AssertionError(_("rope_decode_step: the returned k_cache must hold the cached keys, then the new keys rotated at "
                               "past … past + t - 1, for {given}").format(given=given) + hint)
    close(tensor(value["v_cache"], values.shape, "v_cache"), values, "v_cache", given=given, atol=1e-6,
          reference="torch.cat([v_cache, v], dim=-2)")


@judge("ex12_alibi")
def _judge_alibi(value: Any, sizes: list, lengths: list, t: int) -> None:
    from tinytf.masks import padded_positions, padding_mask

    has_keys(value, ("bias", "positions"))
    assert isinstance(value["bias"], list) and len(value["bias"]) == len(sizes), _("alibi_bias: expected {n} answers").format(
        n=len(sizes))
    for got, (heads, t_q, t_k) in zip(value["bias"], sizes):
        want = reference_alibi(heads, t_q, t_k)
        call = f"alibi_bias({heads}, {t_q}, {t_k})"
        got = tensor(got, want.shape, call, dtype=None)  # the keys after a query are not checked: -inf there is fine
        assert got.is_floating_point(), _("{what} must be a floating-point tensor, got {value_dtype}").format(what=call,
                                                                                                           value_dtype=got.dtype)
        seen = torch.ones(t_q, t_k, dtype=torch.bool).tril(diagonal=t_k - t_q).expand(heads, -1, -1)  # the keys a query may see
        assert bool(torch.isfinite(got[seen]).all()), _("{call} contains inf or NaN on the keys a query may see").format(call=call)
        if not torch.allclose(got.float()[seen], want[seen], atol=1e-5):
            from tinytf.alibi import alibi_bias, alibi_slopes

            start = alibi_bias(alibi_slopes(heads), torch.arange(t_q), torch.arange(t_k))  # queries at 0 … t_q - 1
            mine = got.float()[seen]
            hint = (_(" — the sign is flipped: ALiBi subtracts m_h · distance") if torch.allclose(mine, -want[seen], atol=1e-5)
                    else _(" — aligned to the start: query i sits at t_k - t_q + i") if torch.allclose(mine, start[seen], atol=1e-5)
                    else "")
            raise AssertionError(_("{call} differs from -m_h · (p_i - j) with p_i = t_k - t_q + i (end-aligned) and m_h = "
                                   "2^(-8(h+1)/heads), on the keys each query may see").format(call=call) + hint
                                 + f" ({Pitfall.ALIBI_BIAS.label()})")
    real = padding_mask(lengths, int(t), side="left")[:, 0, 0, :]
    right = padded_positions(lengths, int(t))
    got = tensor(value["positions"], right.shape, f"position_ids({list(lengths)}, {int(t)})", dtype=None)
    assert not got.is_floating_point(), _("position_ids must return integers (a LongTensor), got {dtype}").format(dtype=got.dtype)
    ok = torch.equal(got.long()[real], right[real])
    counted_from_pads = torch.equal(got.long()[real], torch.arange(int(t)).expand_as(right)[real])
    assert ok, (_("position_ids({lengths}, {t}): the real tokens of each row must be numbered 0, 1, 2 … from the row's first real "
                  "token").format(lengths=list(lengths), t=int(t))
                + (f" — {Pitfall.LEFT_PAD_OFFSET.label()}: {_(Pitfall.LEFT_PAD_OFFSET.fix)}" if counted_from_pads else ""))


# ---- probes: the judges' inputs, drawn afresh (by the hidden tests and by the self-check) ---------


def _size(gen: torch.Generator, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi, (), generator=gen))


def _probe_rope(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    b, h, t, d = _size(gen, 1, 3), _size(gen, 1, 4), _size(gen, 2, 7), 2 * _size(gen, 2, 17)  # d >= 4: two pairs or more
    near, far = torch.randn(b, h, t, d, generator=gen), torch.randn(b, h, t, d, generator=gen)
    half = torch.randn(b, h, t, d, generator=gen).bfloat16()  # angles built in x's dtype, or a float32 result, show here
    start = _size(gen, 4000, 9000)  # where bfloat16 or float16 angles are radians off
    first = _size(gen, 1, 20)  # not 0: positions ignored (rotated at 0, 1, …) show near 0 too
    near_positions, far_positions = torch.arange(first, first + t), torch.arange(start, start + t)
    fn = ns["rope"]
    value = {"near": fn(near.clone(), near_positions.clone()), "far": fn(far.clone(), far_positions.clone()),
             "half": fn(half.clone(), far_positions.clone())}
    return value, {"near": near, "far": far, "near_positions": near_positions, "far_positions": far_positions, "half": half}


def _decode_inputs(gen: torch.Generator, t: int, past: int) -> dict[str, Any]:
    b, h, d = _size(gen, 1, 3), _size(gen, 1, 4), 2 * _size(gen, 2, 9)
    q, k, v = (torch.randn(b, h, t, d, generator=gen) for _ in range(3))
    k_cache = reference_rope(torch.randn(b, h, past, d, generator=gen), torch.arange(past))  # rotated when they were cached
    return {"q": q, "k": k, "v": v, "k_cache": k_cache, "v_cache": torch.randn(b, h, past, d, generator=gen), "past": past}


def _probe_decode(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    step = _decode_inputs(gen, 1, _size(gen, 1, 12))  # a decode step after past >= 1 cached tokens: position 0 is wrong
    chunk = _decode_inputs(gen, _size(gen, 2, 5), _size(gen, 1, 9))  # t >= 2 new tokens: they must not see each other's future
    fn = ns["rope_decode_step"]
    value = {}
    with swapped(ns, rope=reference_rope), torch.no_grad():  # part B is graded on tinytf's rotation
        for name, a in (("step", step), ("chunk", chunk)):
            out, keys, values = fn(*(a[n].clone() for n in ("q", "k", "v", "k_cache", "v_cache")), a["past"])
            value[name] = {"out": out, "k_cache": keys, "v_cache": values}
    return {**value.pop("step"), "chunk": value["chunk"]}, {**step, "chunk": chunk}


def _probe_alibi(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    sizes = [[4, 3, 7]]  # on every draw: several heads but not 8, new queries over a longer cache
    for extra in (0, _size(gen, 1, 8)):  # square, then a decode-like t_k > t_q
        t_q = _size(gen, 1, 7)
        sizes.append([2 ** _size(gen, 0, 5), t_q, t_q + extra])
    lengths = [_size(gen, 1, 8) for _ in range(_size(gen, 1, 3))] + [2]  # a row of two real tokens …
    t = max(lengths) + _size(gen, 1, 3)  # … and every row padded on the left
    value = {"bias": [ns["alibi_bias"](*s) for s in sizes], "positions": ns["position_ids"](list(lengths), t)}
    return value, {"sizes": sizes, "lengths": lengths, "t": t}


PROBES: dict[str, Probe] = {"ex12_rope": _probe_rope, "ex12_decode": _probe_decode, "ex12_alibi": _probe_alibi}


# ---- self-check diagnosis -------------------------------------------------------------------------


def diagnose_tasks(namespace: dict[str, Any], only: Iterable[str] | None = None) -> dict[str, list[Finding]]:
    """``{grade_id: findings}`` about the student's ex12 code in ``namespace``: the named checks of :mod:`tinytf.checks.rope`
    and :mod:`tinytf.checks.positions` (the decode step on tinytf's rotation, as in its test), the task's mutants
    (:mod:`.mutants.ex12`), then the judges on fresh inputs for every task without a finding. Never raises."""
    from tinytf.checks import diagnose_alibi, diagnose_padded_positions, diagnose_rope, diagnose_rope_decode

    def decode() -> list[Finding]:
        with swapped(namespace, rope=reference_rope):  # the decode step is judged on its own
            return check_parts(namespace, [("rope_decode_step", lambda fn: stub_or("rope_decode_step", diagnose_rope_decode(fn)))])

    return explained(namespace, PROBES, {
        "ex12_rope": lambda: check_parts(namespace, [("rope", lambda fn: stub_or("rope", diagnose_rope(fn)))]),
        "ex12_decode": decode,
        "ex12_alibi": lambda: check_parts(namespace, [
            ("alibi_bias", lambda fn: stub_or("alibi_bias", diagnose_alibi(fn))),
            ("position_ids", lambda fn: stub_or("position_ids", diagnose_padded_positions(fn)))])}, only=only)


def diagnose(namespace: dict[str, Any]) -> list[Finding]:
    """Findings about the student's ex12 code in ``namespace`` (empty when all looks right); see :func:`diagnose_tasks`."""
    return flat(diagnose_tasks(namespace))
