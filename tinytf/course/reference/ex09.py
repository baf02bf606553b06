"""Exercise 9 — tiled attention with an online softmax (FlashAttention's idea by hand): judges, probes, self-check.

Student code: ``online_softmax_update(m, l, acc, scores, v) -> (m, l, acc)`` (part A),
``tiled_forward(q, k, v, mask=None, *, block_q, block_k) -> out`` (part B, and its measured peak memory)
and ``causal_tiled_forward(q, k, v, *, block_q, block_k) -> (out, tiles_computed)`` (part C). Parts B and C
are graded on tinytf's ``online_softmax_update``, so a mistake in part A costs only part A. The hidden
tests call the probes below (fresh random inputs) and hand the result to the judge, in the notebook and
again in the grader's clean process.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from tinytf.checks import Finding, Pitfall

from ...translation import gettext as _
from . import Probe, check_parts, explained, flat, stub_or, swapped
from .judging import judge
from .validators import close, float_inputs, has_keys, how_off, shapes, tensor

__all__ = ["reference_fold", "diagnose", "diagnose_tasks", "PROBES", "MEMORY_FRACTION"]

NEG_INF = float("-inf")
MEMORY_FRACTION = 4  # the tiled forward's measured peak must stay below 1/4 of one [B, H, T, T] float32 score matrix


def reference_fold(scores: torch.Tensor, v: torch.Tensor, block_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(m, l, acc)`` after folding the key tiles of ``scores [B, bq, Tk]`` and ``v [B, Tk, dv]`` with tinytf's update."""
    from tinytf import online_softmax_update

    b, bq, tk = scores.shape
    m, l, acc = torch.full((b, bq, 1), NEG_INF), torch.zeros(b, bq, 1), torch.zeros(b, bq, v.size(-1))
    for k0 in range(0, tk, block_k):
        m, l, acc = online_softmax_update(m, l, acc, scores[..., k0:k0 + block_k], v[:, k0:k0 + block_k])
    return m, l, acc


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
               is_causal: bool = False) -> torch.Tensor:
    from tinytf import scaled_dot_product_attention

    return scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal)


# ---- judges ---------------------------------------------------------------------------------------


@judge("ex09_update")
def _judge_update(value: Any, scores: torch.Tensor, v: torch.Tensor, block_k: int) -> None:
    has_keys(value, ("m", "l", "acc"), _("online_softmax_update's final (m, l, acc)"))
    scores, v = float_inputs(scores, v)
    m, l, acc = reference_fold(scores, v, int(block_k))
    given = shapes(scores=scores, v=v, block_k=int(block_k))
    got_m = tensor(value["m"], m.shape, _("the running maximum m"), dtype=None)
    assert got_m.is_floating_point() and not bool(torch.isnan(got_m).any()), _("the running maximum m holds NaN (for {given})").format(
        given=given)
    assert torch.equal(got_m == NEG_INF, m == NEG_INF), (
        _("the running maximum m must stay -inf exactly for the rows that have seen only masked scores (for {given})").format(given=given))
    seen = m != NEG_INF
    close(got_m.float()[seen], m[seen], _("the running maximum m"), given=given, reference=_("the maximum of the scores seen so far"))
    close(tensor(value["l"], l.shape, _("the running sum l")), l, _("the running sum l"), given=given, atol=1e-4,
          reference=_("Σ exp(scores - m) over the tiles, rescaled by exp(m - m_new) at every tile"))
    close(tensor(value["acc"], acc.shape, _("the accumulator acc")), acc, _("the accumulator acc"), given=given, atol=1e-4,
          reference=_("Σ exp(scores - m) @ v over the tiles, rescaled by exp(m - m_new) at every tile"))


@judge("ex09_tiled")
def _judge_tiled(value: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_rising: torch.Tensor, k_rising: torch.Tensor,
                 padding: torch.Tensor, empty_rows: torch.Tensor, block_q: int, block_k: int) -> None:
    has_keys(value, ("plain", "rising", "padding", "empty_rows"))
    q, k, v, q_rising, k_rising = float_inputs(q, k, v, q_rising, k_rising)
    assert q.size(-2) != k.size(-2) and k.size(-2) % int(block_k), _("the hidden test uses Tq != Tk, Tk not a multiple of block_k")
    cases = {"plain": (q, k, None), "rising": (q_rising, k_rising, None), "padding": (q, k, padding), "empty_rows": (q, k, empty_rows)}
    for key, (qq, kk, mask) in cases.items():
        expected = _attention(qq, kk, v, mask)
        what = f"tiled_forward ({key.replace('_', ' ')})"
        close(tensor(value[key], expected.shape, what), expected, what, atol=1e-4, reference=_("softmax(q kᵀ / sqrt(d)) v"),
              given=shapes(q=qq, k=kk, mask=mask) + _(", block_q={block_q}, block_k={block_k}").format(block_q=int(block_q),
                  block_k=int(block_k)))


@judge("ex09_memory")
def _judge_memory(value: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int) -> None:
    from tinytf.memory import attention_matrix_bytes

    has_keys(value, ("peak_bytes", "out"))
    q, k, v = float_inputs(q, k, v)
    expected = _attention(q, k, v)
    close(tensor(value["out"], expected.shape, _("tiled_forward's output")), expected, _("tiled_forward's output"), atol=1e-4,
          given=shapes(q=q, k=k) + _(", blocks {block}").format(block=int(block)), reference=_("softmax(q kᵀ / sqrt(d)) v"))
    peak = value["peak_bytes"]
    assert isinstance(peak, int) and not isinstance(peak, bool) and peak > 0, (
        _("the measured peak must be a positive int, got {peak!r}").format(peak=peak))
    b, h, t = q.size(0), q.size(1), q.size(-2)
    scores = attention_matrix_bytes(b, h, t, torch.float32)
    assert peak < scores / MEMORY_FRACTION, (
        _("tiled_forward's measured peak is {peak} bytes for q, k, v {q_shape} with {block} × {block} tiles: {value:.2f}× one [B, H, T, "
          "T] float32 score matrix ({scores} bytes). A tiled forward holds one tile ({value2} bytes) of scores at a time: compute q_i @ "
          "k_jᵀ per tile, never q @ kᵀ.").format(peak=peak, q_shape=list(q.shape), block=int(block), value=peak / scores, scores=scores,
              value2=b * h * int(block) ** 2 * 4))


@judge("ex09_causal")
def _judge_causal(value: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_long: torch.Tensor, v_long: torch.Tensor,
                  block_q: int, block_k: int) -> None:
    from tinytf.checks.tiled_probes import tile_count

    has_keys(value, ("square", "longer"))
    q, k, v, k_long, v_long = float_inputs(q, k, v, k_long, v_long)
    for key, (kk, vv) in (("square", (k, v)), ("longer", (k_long, v_long))):
        got = has_keys(value[key], ("out", "computed"), _("causal_tiled_forward's result ({key})").format(key=key))
        expected = _attention(q, kk, vv, is_causal=True)
        given = shapes(q=q, k=kk) + _(", block_q={block_q}, block_k={block_k}").format(block_q=int(block_q), block_k=int(block_k))
        close(tensor(got["out"], expected.shape, f"causal_tiled_forward ({key})"), expected, f"causal_tiled_forward ({key})",
              atol=1e-4, given=given, reference="tinytf.scaled_dot_product_attention(q, k, v, is_causal=True)")
        tq, tk, bq, bk = q.size(-2), kk.size(-2), int(block_q), int(block_k)
        want, total = tile_count(tq, tk, bq, bk), -(-tq // bq) * -(-tk // bk)
        assert got["computed"] == want, (
            _("causal_tiled_forward ({key}) computed {got!r} tiles for {given}; {want} of the {total} tiles hold a key some query may "
              "see, the others lie wholly in the future and are skipped").format(key=key, got=got['computed'], given=given, want=want,
                  total=total) + how_off(got["computed"], want, step=(_("tile"), 1)))


# ---- probes: the judges' inputs, drawn afresh (by the hidden tests and by the self-check) ---------


def _size(gen: torch.Generator, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi, (), generator=gen))


def _tinytf_update(ns: dict[str, Any]) -> Any:
    from tinytf import online_softmax_update

    return swapped(ns, online_softmax_update=online_softmax_update)  # parts B and C are graded on their own


def _probe_update(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    b, bq, bk, dv = _size(gen, 1, 3), _size(gen, 3, 7), _size(gen, 2, 5), _size(gen, 2, 6)
    tk = bk * _size(gen, 3, 5) + _size(gen, 1, bk)  # three or more tiles, the last one partial
    ramp = torch.linspace(-4.0, 4.0, tk)  # every later tile raises the maximum ...
    scores = ramp + 0.3 * torch.randn(b, bq, tk, generator=gen)
    scores[:, 1, :] = ramp.flip(0) + 0.3 * torch.randn(b, tk, generator=gen)  # ... except in row 1, whose first tile holds it ...
    scores[:, 0, :bk] = NEG_INF  # ... row 0's first tile is fully masked ...
    scores[:, -1, :] = NEG_INF  # ... and the last row may see nothing
    v = torch.randn(b, tk, dv, generator=gen)
    m, l, acc = torch.full((b, bq, 1), NEG_INF), torch.zeros(b, bq, 1), torch.zeros(b, bq, dv)
    for k0 in range(0, tk, bk):
        m, l, acc = ns["online_softmax_update"](m, l, acc, scores[..., k0:k0 + bk].clone(), v[:, k0:k0 + bk].clone())
    return {"m": m, "l": l, "acc": acc}, {"scores": scores, "v": v, "block_k": bk}


def _probe_tiled(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    from tinytf.checks.tiled_probes import empty_rows, ordered_qkv

    b, h, d, dv, bq, bk = _size(gen, 1, 3), _size(gen, 1, 4), _size(gen, 2, 12), _size(gen, 2, 9), _size(gen, 2, 6), _size(gen, 2, 6)
    tq, tk = _size(gen, 3, 20), _size(gen, 3, 24)
    while tq % bq == 0:  # Tq not a multiple of block_q: the last query block is partial
        tq += 1
    while tk == tq or tk % bk == 0:  # Tq != Tk, and Tk not a multiple of block_k: the last key tile is partial
        tk += 1
    q, k, v = ordered_qkv((b, h, tq, tk, d, dv), gen, "random")
    q_r, k_r, _ = ordered_qkv((b, h, tq, tk, d, dv), gen, "rising")
    lengths = torch.randint(1, tk, (b,), generator=gen)
    pad = (torch.arange(tk)[None, :] < lengths[:, None])[:, None, None, :]  # [B, 1, 1, Tk]
    empty = empty_rows(b, tq, tk, gen)  # [B, 1, Tq, Tk], rows 0, 3, ... may see nothing
    fn = ns["tiled_forward"]
    with _tinytf_update(ns), torch.no_grad():
        value = {"plain": fn(q, k, v, block_q=bq, block_k=bk), "rising": fn(q_r, k_r, v, block_q=bq, block_k=bk),
                 "padding": fn(q, k, v, pad, block_q=bq, block_k=bk), "empty_rows": fn(q, k, v, empty, block_q=bq, block_k=bk)}
    return value, {"q": q, "k": k, "v": v, "q_rising": q_r, "k_rising": k_r, "padding": pad, "empty_rows": empty,
                   "block_q": bq, "block_k": bk}


def _probe_memory(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    from tinytf.memory import PeakMemoryMeter

    t, block = _size(gen, 448, 577), 64
    if t % block == 0:  # a partial last tile on every draw: a tiled_forward that assumes whole tiles shows
        t += 1
    q, k, v = (torch.randn(1, 2, t, 16, generator=gen) for _ in range(3))
    with _tinytf_update(ns), torch.no_grad(), PeakMemoryMeter("cpu") as meter:
        out = ns["tiled_forward"](q, k, v, block_q=block, block_k=block)
    return {"peak_bytes": int(meter.peak), "out": out}, {"q": q, "k": k, "v": v, "block": block}


def _probe_causal(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    b, h, d, bq, bk, tq = _size(gen, 1, 3), _size(gen, 1, 3), _size(gen, 2, 9), _size(gen, 2, 6), _size(gen, 2, 6), _size(gen, 4, 16)
    bq = min(bq, tq - 1)  # at least two query tiles
    # the first query tile's last visible key, Tk - Tq + block_q, ends exactly on a key tile's boundary (and a key tile
    # lies beyond it): "one tile too many" off-by-ones count that tile, every run
    tk = tq - bq + bk * (bq // bk + 1 + _size(gen, 0, 2))
    q, k, v = (torch.randn(b, h, tq, d, generator=gen) for _ in range(3))
    k_long, v_long = torch.randn(b, h, tk, d, generator=gen), torch.randn(b, h, tk, d, generator=gen)
    fn = ns["causal_tiled_forward"]
    with _tinytf_update(ns), torch.no_grad():
        (o1, c1), (o2, c2) = fn(q, k, v, block_q=bq, block_k=bk), fn(q, k_long, v_long, block_q=bq, block_k=bk)
    value = {"square": {"out": o1, "computed": c1}, "longer": {"out": o2, "computed": c2}}
    return value, {"q": q, "k": k, "v": v, "k_long": k_long, "v_long": v_long, "block_q": bq, "block_k": bk}


PROBES: dict[str, Probe] = {"ex09_update": _probe_update, "ex09_tiled": _probe_tiled, "ex09_memory": _probe_memory,
                            "ex09_causal": _probe_causal}


# ---- self-check diagnosis -------------------------------------------------------------------------


def diagnose_tasks(namespace: dict[str, Any], only: Iterable[str] | None = None) -> dict[str, list[Finding]]:
    """``{grade_id: findings}`` about the student's ex09 code in ``namespace``: the named checks (parts B and C on tinytf's
    online_softmax_update, as in their tests), the task's mutants (:mod:`.mutants.ex09`), then the judges on fresh inputs
    for every task without a finding. Never raises."""
    from tinytf import online_softmax_update
    from tinytf.checks import diagnose_causal_tiles, diagnose_online_softmax, diagnose_tiled_attention

    def own(name: str, check: Any) -> Any:
        def run() -> list[Finding]:
            with swapped(namespace, online_softmax_update=online_softmax_update):  # parts B and C are judged on their own
                return check_parts(namespace, [(name, lambda fn: stub_or(name, check(fn)))])
        return run

    found_by = explained(namespace, PROBES, {
        "ex09_update": lambda: check_parts(namespace, [("online_softmax_update",
                                                        lambda fn: stub_or("online_softmax_update", diagnose_online_softmax(fn)))]),
        "ex09_tiled": own("tiled_forward", diagnose_tiled_attention), "ex09_causal": own("causal_tiled_forward", diagnose_causal_tiles)},
        only=only)
    held = [f for f in found_by.get("ex09_tiled", []) if f.pitfall is Pitfall.EXPLICIT_IN_PRODUCTION]
    if held and "ex09_memory" in found_by:  # tiled_forward's output is right, its memory is not: the memory test's mistake
        found_by["ex09_tiled"] = [f for f in found_by["ex09_tiled"] if f not in held]
        found_by["ex09_memory"] = found_by["ex09_memory"] if any(f.pitfall is Pitfall.EXPLICIT_IN_PRODUCTION
                                                                 for f in found_by["ex09_memory"]) else held
    elif found_by.get("ex09_tiled") and found_by.get("ex09_memory"):  # the memory test runs tiled_forward too: say why it fails
        found_by["ex09_memory"] = [Finding(Pitfall.GENERAL, _("ex09_memory would not earn its points"),
                                           _("the memory test runs tiled_forward, whose mistake is named above (ex09_tiled)."),
                                           fix=_("fix tiled_forward first (see its finding above)"))]
    return found_by


def diagnose(namespace: dict[str, Any]) -> list[Finding]:
    """Findings about the student's ex09 code in ``namespace`` (empty when all looks right); see :func:`diagnose_tasks`."""
    return flat(diagnose_tasks(namespace))
