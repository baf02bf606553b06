"""Exercise 10 — grouped-query attention, the KV cache's bytes and a sliding window: judges, probes, self-check.

Student code: ``expand_kv(kv, heads)`` and ``grouped_attention(q, k, v, mask=None)`` (part A),
``cache_bytes(batch, layers, kv_heads, head_dim, tokens, dtype_bytes, window=None)`` (part B) and
``sliding_window_mask(t_q, t_k, window)`` (part C). ``grouped_attention`` is graded on tinytf's K/V head
sharing, so a mistake in ``expand_kv`` costs only its own points. The hidden tests call the probes below
(fresh random shapes) and hand the result to the judge, in the notebook and again in the grader's clean
process; the references are ``F.scaled_dot_product_attention(..., enable_gqa=True)``,
``tinytf.memory.kv_cache_bytes`` and ``tinytf.causal_mask(..., window=)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from tinytf.checks import Finding, Pitfall, found

from ...translation import N_
from ...translation import gettext as _
from . import Probe, call_student, check_parts, explained, flat, stub_or, swapped
from .judging import judge
from .validators import bool_mask, close, float_inputs, has_keys, how_off, shapes, tensor

__all__ = ["reference_expand_kv", "reference_cache_bytes", "diagnose", "diagnose_tasks", "PROBES"]


def reference_expand_kv(kv: torch.Tensor, heads: int) -> torch.Tensor:
    """tinytf's K/V head sharing: ``[B, kv_heads, T, d] -> [B, heads, T, d]``, query head ``h`` gets ``h // groups``."""
    from tinytf import repeat_kv

    return repeat_kv(kv, heads // kv.size(1))


def reference_cache_bytes(batch: int, layers: int, kv_heads: int, head_dim: int, tokens: int, dtype_bytes: int,
                          window: int | None = None) -> int:
    """``2 · layers · batch · kv_heads · min(tokens, window) · head_dim · dtype_bytes`` (tinytf.memory.kv_cache_bytes)."""
    from tinytf.memory import kv_cache_bytes

    dtype = {1: torch.int8, 2: torch.float16, 4: torch.float32, 8: torch.float64}[int(dtype_bytes)]
    return kv_cache_bytes(batch, layers, kv_heads, tokens, head_dim, dtype, window=window)


# ---- judges ---------------------------------------------------------------------------------------


@judge("ex10_expand")
def _judge_expand(value: Any, kv: torch.Tensor, heads: int) -> None:
    (kv,) = float_inputs(kv)
    heads = int(heads)
    expected = reference_expand_kv(kv, heads)
    out = tensor(value, expected.shape, "expand_kv(kv, heads)")
    groups = heads // kv.size(1)
    assert not torch.equal(out, kv.repeat(1, groups, 1, 1)), (
        _("expand_kv tiles the K/V heads (k0 k1 k0 k1, what kv.repeat gives) for {shapes}: query head h must get K/V head h // {groups}, "
          "not h % {kv_size} — {Pitfall_KV_GROUPING_label}. Use kv.repeat_interleave({groups}, dim=1).").format(
              shapes=shapes(kv=kv, heads=heads), groups=groups, kv_size=kv.size(1),
              Pitfall_KV_GROUPING_label=Pitfall.KV_GROUPING.label()))
    close(out, expected, "expand_kv(kv, heads)", given=shapes(kv=kv, heads=heads), atol=0.0, rtol=0.0,
          reference="kv.repeat_interleave(heads // kv_heads, dim=1)")


@judge("ex10_grouped")
def _judge_grouped(value: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, k_one: torch.Tensor,
                   v_one: torch.Tensor, bad_kv_heads: int) -> None:
    import torch.nn.functional as F

    has_keys(value, ("plain", "masked", "multi_query", "raised"))
    q, k, v, k_one, v_one = float_inputs(q, k, v, k_one, v_one)
    mask = bool_mask(mask)
    assert 1 < k.size(1) < q.size(1), _("the hidden test uses 1 < kv_heads < heads, where the head order matters")
    cases = {"plain": (k, v, None), "masked": (k, v, mask), "multi_query": (k_one, v_one, None)}
    for key, (kk, vv, m) in cases.items():
        expected = F.scaled_dot_product_attention(q, kk, vv, attn_mask=m, enable_gqa=True)
        what = f"grouped_attention ({key.replace('_', '-')})"
        close(tensor(value[key], expected.shape, what), expected, what, atol=1e-5, given=shapes(q=q, k=kk, mask=m),
              reference="F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)")
    assert value["raised"] == "ValueError", (
        _("grouped_attention with heads={q_size} and kv_heads={bad_kv_heads} (which does not divide it) must raise a ValueError that "
          "names both counts; it {value}").format(q_size=q.size(1), bad_kv_heads=int(bad_kv_heads),
              value='returned' if value['raised'] == 'nothing' else 'raised ' + str(value['raised'])))


@judge("ex10_cache")
def _judge_cache(value: Any, args: list) -> None:
    assert isinstance(value, list) and len(value) == len(args), _("cache_bytes: expected {n_args} answers, got {value!r}").format(
        n_args=len(args), value=value)
    for got, a in zip(value, args):
        batch, layers, kv_heads, head_dim, tokens, dtype_bytes, window = a
        want = reference_cache_bytes(*a)
        call = (f"cache_bytes(batch={batch}, layers={layers}, kv_heads={kv_heads}, head_dim={head_dim}, tokens={tokens}, "
                f"dtype_bytes={dtype_bytes}, window={window})")
        assert isinstance(got, int) and not isinstance(got, bool), _("{call} must return an int number of bytes, got {got!r}").format(
            call=call, got=got)
        kept = tokens if window is None else min(tokens, window)
        suspects = {_("dtype_bytes={dtype_bytes} looks ignored (2 bytes per number assumed)").format(dtype_bytes=dtype_bytes):
                    2 / dtype_bytes,
                    _("dtype_bytes={dtype_bytes} looks ignored (1 byte per number assumed)").format(dtype_bytes=dtype_bytes):
                    1 / dtype_bytes,
                    _("only the keys (or only the values) are counted: the formula starts with 2 ·"): 0.5,
                    _("layers={layers} looks ignored").format(layers=layers): 1 / layers,
                    _("batch={batch} looks ignored").format(batch=batch): 1 / batch,
                    _("kv_heads={kv_heads} looks ignored").format(kv_heads=kv_heads): 1 / kv_heads,
                    _("head_dim={head_dim} looks ignored").format(head_dim=head_dim): 1 / head_dim,
                    _("the window looks ignored: {tokens} tokens counted, not min(tokens, window) = {kept}")
                    .format(tokens=tokens, kept=kept): tokens / kept}
        one_token = 2 * layers * batch * kv_heads * head_dim * dtype_bytes
        assert got == want, (_("{call} = {got}, should be {want} = 2 (keys and values) · layers · batch · kv_heads · min(tokens, window) "
                               "· head_dim · dtype_bytes").format(call=call, got=got, want=want)
                             + how_off(got, want, suspects=suspects, step=(_("token"), one_token)))


@judge("ex10_window")
def _judge_window(value: Any, sizes: list) -> None:
    from tinytf import causal_mask

    assert isinstance(value, list) and len(value) == len(sizes), _("sliding_window_mask: expected {n_sizes} masks").format(
        n_sizes=len(sizes))
    for got, (t_q, t_k, window) in zip(value, sizes):
        want = causal_mask(t_q, t_k, window=window)
        call = f"sliding_window_mask({t_q}, {t_k}, {window})"
        got = tensor(got, want.shape, call, dtype=torch.bool)
        seen, should = got.sum(-1).tolist(), want.sum(-1).tolist()
        off_by_one = all(abs(a - b) <= 1 for a, b in zip(seen, should)) and not (got & ~causal_mask(t_q, t_k)).any()
        hint = _(" — {Pitfall_WINDOW_OFF_BY_ONE_label}: the window counts the query itself").format(
            Pitfall_WINDOW_OFF_BY_ONE_label=Pitfall.WINDOW_OFF_BY_ONE.label()) if off_by_one else ""
        assert torch.equal(got, want), (
            _("{call}: the queries see {seen} keys, should see {should} (the query at position p = t_k - t_q + i sees keys p - window + "
              "1 … p){hint}").format(call=call, seen=seen, should=should, hint=hint))


# ---- probes: the judges' inputs, drawn afresh (by the hidden tests and by the self-check) ---------


def _size(gen: torch.Generator, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi, (), generator=gen))


def _probe_expand(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    kv_heads, groups = _size(gen, 2, 4), _size(gen, 2, 4)  # 1 < kv_heads < heads: repeat and repeat_interleave differ
    if groups == kv_heads:  # heads // kv_heads != kv_heads: grouping by the wrong count shows on every draw
        groups += 1
    kv = torch.randn(_size(gen, 1, 3), kv_heads, _size(gen, 2, 9), _size(gen, 2, 9), generator=gen)
    return ns["expand_kv"](kv.clone(), kv_heads * groups), {"kv": kv, "heads": kv_heads * groups}


def _probe_grouped(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    from tinytf import causal_mask

    b, kv_heads, groups = _size(gen, 1, 3), _size(gen, 2, 4), _size(gen, 2, 4)  # 1 < kv_heads < heads
    d, dv, t_q = _size(gen, 2, 9), _size(gen, 2, 9), _size(gen, 2, 8)
    heads, t_k = kv_heads * groups, t_q + _size(gen, 0, 6)
    q = torch.randn(b, heads, t_q, d, generator=gen)
    k, v = torch.randn(b, kv_heads, t_k, d, generator=gen), torch.randn(b, kv_heads, t_k, dv, generator=gen)
    k_one, v_one = k[:, :1].clone(), v[:, :1].clone()
    mask = causal_mask(t_q, t_k)
    bad = next(g for g in range(2, heads) if heads % g)
    fn = ns["grouped_attention"]
    with swapped(ns, expand_kv=reference_expand_kv), torch.no_grad():  # part A's second task is graded on its own
        value = {"plain": fn(q.clone(), k.clone(), v.clone()), "masked": fn(q.clone(), k.clone(), v.clone(), mask),
                 "multi_query": fn(q.clone(), k_one.clone(), v_one.clone())}
        value["raised"] = _raised(fn, q, torch.randn(b, bad, t_k, d, generator=gen), torch.randn(b, bad, t_k, dv, generator=gen))
    return value, {"q": q, "k": k, "v": v, "mask": mask, "k_one": k_one, "v_one": v_one, "bad_kv_heads": bad}


def _raised(fn: Any, *args: Any) -> str:
    """The name of the exception ``fn(*args)`` raises, or ``"nothing"``."""
    try:
        fn(*args)
    except Exception as err:  # noqa: BLE001 - which exception is the answer
        return type(err).__name__
    return "nothing"


def _probe_cache(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    args = []
    for window, dtype_bytes in (("none", 1), ("short", 2), ("long", 4), ("none", 8)):  # every dtype, every run
        tokens = _size(gen, 8, 5000)
        w = None if window == "none" else (_size(gen, 1, tokens) if window == "short" else tokens + _size(gen, 0, 100))
        args.append([_size(gen, 1, 9), _size(gen, 1, 33), _size(gen, 1, 9), 8 * _size(gen, 1, 17), tokens, dtype_bytes, w])
    return [ns["cache_bytes"](*a) for a in args], {"args": args}


def _probe_window(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    sizes = []
    for extra in (0, _size(gen, 1, 8)):  # square, then a decode-like t_k > t_q
        t_q = _size(gen, 3, 12)
        sizes.append([t_q, t_q + extra, _size(gen, 2, t_q)])
    sizes.append([4, 6, 1])  # a query sees itself only
    return [ns["sliding_window_mask"](*s) for s in sizes], {"sizes": sizes}


PROBES: dict[str, Probe] = {"ex10_expand": _probe_expand, "ex10_grouped": _probe_grouped, "ex10_cache": _probe_cache,
                            "ex10_window": _probe_window}


# ---- self-check diagnosis -------------------------------------------------------------------------

_CACHE_ARGS = ((2, 4, 2, 16, 100, 2, None), (1, 3, 4, 8, 64, 4, 16), (3, 2, 1, 32, 10, 2, 50))
_CACHE_MISTAKES = (  # (what it computes, pitfall, title, evidence, fix)
    (lambda b, n, g, d, t, s, w: reference_cache_bytes(b, n, g, d, t, s, w) // 2, Pitfall.KV_CACHE, N_("only the keys are counted"),
     N_("cache_bytes is half the right size: the cache holds keys and values."),
     N_("count keys and values: start the formula with 2 ·")),
    (lambda b, n, g, d, t, s, w: reference_cache_bytes(b, n, g, d, t, s), Pitfall.GENERAL, N_("the window does not cap the cache"),
     N_("with a window shorter than the sequence a rolling cache keeps only min(tokens, window) tokens per layer."),
     N_("count min(tokens, window) tokens when a window is given")),
    (lambda b, n, g, d, t, s, w: reference_cache_bytes(b, n, g, d, t if w is None else w, s), Pitfall.GENERAL,
     N_("the window is used even when the sequence is shorter"), N_("a cache never holds more tokens than were written."),
     N_("count min(tokens, window) tokens, not window")),
    (lambda b, n, g, d, t, s, w: reference_cache_bytes(b, n, g, d, t, 2, w), Pitfall.GENERAL, N_("dtype_bytes is ignored"),
     N_("exactly half for a 4-byte dtype (and right for 2 bytes): dtype_bytes=4 looks ignored."),
     N_("multiply by dtype_bytes instead of a fixed 2")),
)


def _diagnose_cache(fn: Any) -> list[Finding]:
    got = []
    for a in _CACHE_ARGS:
        out, err = call_student("cache_bytes", fn, *a)
        if err is not None:
            return [err]
        got.append(out)
    if got == [reference_cache_bytes(*a) for a in _CACHE_ARGS]:
        return []
    for wrong, pitfall, title, why, fix in _CACHE_MISTAKES:
        if all(g == wrong(*a) for g, a in zip(got, _CACHE_ARGS)):
            shown = next((i for i, a in enumerate(_CACHE_ARGS) if got[i] != reference_cache_bytes(*a)), 0)
            return [found(pitfall, _(title), _("{why} cache_bytes{args} gave {got}, should be {right}.").format(
                why=_(why), args=_CACHE_ARGS[shown], got=got[shown], right=reference_cache_bytes(*_CACHE_ARGS[shown])),
                fix=_(fix))]
    return []  # an unnamed mistake: the judge's message says what differs


def diagnose_tasks(namespace: dict[str, Any], only: Iterable[str] | None = None) -> dict[str, list[Finding]]:
    """``{grade_id: findings}`` about the student's ex10 code in ``namespace``: the named checks (grouped_attention on
    tinytf's expand_kv, as in its test), the task's mutants (:mod:`.mutants.ex10`), then the judges on fresh inputs for
    every task without a finding. Never raises."""
    from tinytf.checks import diagnose_expand_kv, diagnose_kv_grouping, diagnose_window

    def grouped() -> list[Finding]:
        with swapped(namespace, expand_kv=reference_expand_kv):  # grouped_attention is judged on its own
            return check_parts(namespace, [("grouped_attention", lambda fn: stub_or("grouped_attention", diagnose_kv_grouping(fn)))])

    return explained(namespace, PROBES, {
        "ex10_expand": lambda: check_parts(namespace, [("expand_kv", lambda fn: stub_or("expand_kv", diagnose_expand_kv(fn)))]),
        "ex10_grouped": grouped, "ex10_cache": lambda: check_parts(namespace, [("cache_bytes", _diagnose_cache)]),
        "ex10_window": lambda: check_parts(namespace, [("sliding_window_mask",
                                                        lambda fn: stub_or("sliding_window_mask", diagnose_window(fn)))])}, only=only)


def diagnose(namespace: dict[str, Any]) -> list[Finding]:
    """Findings about the student's ex10 code in ``namespace`` (empty when all looks right); see :func:`diagnose_tasks`."""
    return flat(diagnose_tasks(namespace))
