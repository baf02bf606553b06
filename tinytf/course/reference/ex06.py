"""Exercise 6 — explicit attention vs F.scaled_dot_product_attention: judges and the self-check.

Student code: ``saved_tensor_bytes(fn, *args) -> int`` (bytes autograd saves for backward, every
pack-hook call counted) and ``benchmark_attention(ts, *, batch, heads, head_dim, dtype, causal,
warmup, repeats, device)`` returning ``{"conditions": {...}, "explicit": {T: row}, "sdpa": {T: row}}``
with rows ``{"saved_bytes", "peak_bytes", "ms", "tokens_per_s"}``. Measurements are judged on
structure and plausibility; the saved bytes are deterministic on a CPU and are recomputed exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F

from tinytf.checks import Finding, Pitfall, found

from ...translation import gettext as _
from . import Probe, call_student, check_parts, explained, flat, swapped
from .judging import judge
from .validators import has_keys, how_off, positive

__all__ = ["reference_saved_bytes", "saved_bytes", "diagnose", "diagnose_tasks", "PROBES"]

ROW_KEYS = ("saved_bytes", "peak_bytes", "ms", "tokens_per_s")
CONDITION_KEYS = ("batch", "heads", "head_dim", "dtype", "mask", "device", "repeats")


def reference_saved_bytes(fn: Callable[..., Any], *args: Any) -> tuple[int, int]:
    """``(every_call, distinct)``: bytes of the tensors autograd saves while computing ``fn(*args)``,
    counting every pack-hook call, and counting each distinct tensor (same storage, shape, stride) once."""
    total, seen = 0, {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        n = t.numel() * t.element_size()
        total += n
        seen[(t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)] = n
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return total, sum(seen.values())


def saved_bytes(fn: Callable[..., Any], *args: Any) -> int:
    """tinytf's ``saved_tensor_bytes``: every pack-hook call counted (what part B runs on when graded on its own)."""
    return reference_saved_bytes(fn, *args)[0]


def _paths() -> dict[str, Callable[..., torch.Tensor]]:
    from tinytf import scaled_dot_product_attention

    return {"explicit": lambda q, k, v, c=False: scaled_dot_product_attention(q, k, v, is_causal=c),
            "sdpa": lambda q, k, v, c=False: F.scaled_dot_product_attention(q, k, v, is_causal=c)}


def _qkv(b: int, h: int, t: int, d: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(b, h, t, d, generator=g).requires_grad_() for _ in range(3)]


def _rows(results: Any, ts: list[int], what: str) -> dict[str, dict[int, dict[str, float]]]:
    """Check the structure of a benchmark_attention result (keys may be ints or, after export, strings)."""
    has_keys(results, ("explicit", "sdpa"), what)
    out: dict[str, dict[int, dict[str, float]]] = {}
    for name in ("explicit", "sdpa"):
        table = results[name]
        assert isinstance(table, dict), _("{what}: results[{name!r}] must be a dict keyed by T").format(what=what, name=name)
        by_t = {int(t): row for t, row in table.items()}
        assert sorted(by_t) == sorted(ts), _("{what}: {name} has T values {by_t}, expected {ts}").format(what=what, name=name,
            by_t=sorted(by_t), ts=sorted(ts))
        out[name] = {}
        for t, row in by_t.items():
            assert isinstance(row, dict), _("{what}: {name} T={t} must be a dict").format(what=what, name=name, t=t)
            out[name][t] = {key: positive(row.get(key), f"{what}: {name} T={t} {key}") for key in ROW_KEYS}
    return out


def _growth(rows: dict[int, dict[str, float]], key: str) -> list[float]:
    ts = sorted(rows)
    return [rows[b][key] / rows[a][key] for a, b in zip(ts, ts[1:])]


# ---- judges ---------------------------------------------------------------------------------------


@judge("ex06_saved")
def _judge_saved(value: Any, batch: int, heads: int, tokens: int, head_dim: int) -> None:
    has_keys(value, ("explicit", "explicit_causal", "sdpa", "exp"))
    q, k, v = _qkv(int(batch), int(heads), int(tokens), int(head_dim))
    paths = _paths()
    cases = {"explicit": (paths["explicit"], q, k, v), "explicit_causal": (paths["explicit"], q, k, v, True),
             "sdpa": (paths["sdpa"], q, k, v), "exp": (lambda t: t.exp(), q)}
    for key, (fn, *args) in cases.items():
        got = value[key]
        assert isinstance(got, int) and not isinstance(got, bool), _("saved_tensor_bytes must return an int ({key}: {type})").format(
            key=key, type=type(got).__name__)
        right = reference_saved_bytes(fn, *args)
        assert got in right, (_("saved_tensor_bytes counts the wrong number of bytes ({key}): {got}, should be {right}").format(
            key=key, got=got, right=right[0]) + how_off(got, right[0], suspects=_saved_suspects()))


def _saved_suspects() -> dict[str, float]:
    """The ratios a byte count off by a known mistake has to the right one, named in the student's language."""
    return {_("elements are counted, not bytes (t.numel() without t.element_size() = 4 for float32)"): 0.25}


@judge("ex06_bench")
def _judge_bench(value: Any, ts: list[int], heads: int, head_dim: int) -> None:
    has_keys(value, ("main", "fresh"))
    main = value["main"]
    assert isinstance(main, dict) and isinstance(main.get("conditions"), dict), _("the results must record their conditions")
    for key in CONDITION_KEYS:
        assert key in main["conditions"], _("the conditions must record {key!r}").format(key=key)
    assert main["conditions"]["mask"] == "causal", _("the main benchmark uses the causal mask")
    rows = _rows(main, [256, 512, 1024], _("main benchmark"))
    assert all(g > 2.5 for g in _growth(rows["explicit"], "saved_bytes")), _("explicit saved bytes must grow ~4x per doubling of T")
    assert rows["sdpa"][1024]["saved_bytes"] < rows["explicit"][1024]["saved_bytes"], _("SDPA must save less than explicit at T=1024")
    assert rows["sdpa"][1024]["peak_bytes"] < rows["explicit"][1024]["peak_bytes"], _("SDPA's peak must be lower than explicit's at T=1024")

    ts = [int(t) for t in ts]
    fresh = _rows(value["fresh"], ts, _("fresh benchmark"))
    paths = _paths()
    for t in ts:
        for name in ("explicit", "sdpa"):
            expected = reference_saved_bytes(paths[name], *_qkv(1, int(heads), t, int(head_dim)), True)
            got = int(fresh[name][t]["saved_bytes"])
            assert got in expected, (_("fresh benchmark: {name} T={t} saved_bytes = {got} differs from the reference {want}").format(
                name=name, t=t, got=got, want=expected[0]) + how_off(got, expected[0], suspects=_saved_suspects()))
    assert all(g > 2.5 for g in _growth(fresh["explicit"], "saved_bytes")), _("explicit saved bytes must grow ~4x per doubling of T")


# ---- self-check diagnosis -------------------------------------------------------------------------


def _diagnose_saved(fn: Any) -> list[Finding]:
    x = torch.randn(3, 5, requires_grad=True)
    n, problem = call_student("saved_tensor_bytes", fn, lambda t: t.exp(), x)
    if problem:
        return [problem]
    if not isinstance(n, int) or isinstance(n, bool):
        return [found(Pitfall.GENERAL, _("saved_tensor_bytes must return an int"), _("got {type}.").format(type=type(n).__name__),
                      fix=_("add up the int t.numel() * t.element_size() of each saved tensor"))]
    if n == 15:
        return [found(Pitfall.GENERAL, _("saved_tensor_bytes counts elements, not bytes"),
                      _("x.exp() on a [3, 5] float32 tensor saves its 60-byte output; you counted {n}{how}.")
                      .format(n=n, how=how_off(n, 60)),
                      fix=_("multiply t.numel() by t.element_size() (4 for float32)"))]
    if n != 60:
        return [found(Pitfall.GENERAL, _("saved_tensor_bytes counts the wrong bytes"),
                      _("x.exp() on a [3, 5] float32 tensor saves its 60-byte output; you counted {n}{how}.")
                      .format(n=n, how=how_off(n, 60)),
                      fix=_("add t.numel() * t.element_size() in the pack hook and return the tensor unchanged"))]
    q, k, v = _qkv(1, 2, 32, 8)
    explicit = _paths()["explicit"]
    n, problem = call_student("saved_tensor_bytes", fn, explicit, q, k, v, True)
    if problem:
        return [problem]
    if n not in reference_saved_bytes(explicit, q, k, v, True):
        right = reference_saved_bytes(explicit, q, k, v, True)[0]
        return [found(Pitfall.GENERAL, _("saved_tensor_bytes is wrong on attention"),
                      _("the explicit causal path on q, k, v [1, 2, 32, 8] saves {right} bytes; you counted {n}{how}.").format(
                          right=right, n=n, how=how_off(n, right)),
                      fix=_("count every tensor the pack hook receives while fn(*args) runs (pass *args through to fn)"))]
    return []


def _diagnose_bench(fn: Any, namespace: dict[str, Any]) -> list[Finding]:
    with swapped(namespace, saved_tensor_bytes=saved_bytes):  # part B is judged on its own
        res, problem = call_student("benchmark_attention", fn, (32, 64), batch=1, heads=1, head_dim=8, causal=True,
                                    warmup=0, repeats=1, device="cpu")
    if problem:
        return [problem]
    try:
        rows = _rows(res, [32, 64], _("benchmark_attention((32, 64))"))
    except AssertionError as err:
        return [found(Pitfall.GENERAL, _("benchmark_attention returns the wrong structure"), _("{err}.").format(err=err),
                      fix=_("return {'conditions': {...}, 'explicit': {T: row}, 'sdpa': {T: row}} with the row keys "
                            "saved_bytes, peak_bytes, ms, tokens_per_s"))]
    if not isinstance(res.get("conditions"), dict) or not all(key in res["conditions"] for key in CONDITION_KEYS):
        return [found(Pitfall.COLD_TIMING, _("benchmark_attention does not record its conditions"),
                      _("a number without its conditions cannot be compared."),
                      fix=_("return them under 'conditions': {value_join}").format(value_join=", ".join(CONDITION_KEYS)))]
    if rows["explicit"][64]["saved_bytes"] <= rows["explicit"][32]["saved_bytes"]:
        return [found(Pitfall.GENERAL, _("saved bytes do not grow with T"),
                      _("explicit saved {small} bytes at T=32 and {large} at T=64.").format(
                          small=rows['explicit'][32]['saved_bytes'], large=rows['explicit'][64]['saved_bytes']),
                      fix=_("measure each T on its own q, k, v of length T"))]
    return _causal_findings(rows, res["conditions"])


def _causal_findings(rows: dict[str, dict[int, dict[str, float]]], conditions: dict[str, Any]) -> list[Finding]:
    """benchmark_attention(causal=True) must measure both paths with is_causal=True, as its conditions claim."""
    findings = []
    for name, path in _paths().items():
        got = int(rows[name][64]["saved_bytes"])
        causal, plain = (reference_saved_bytes(path, *_qkv(1, 1, 64, 8), c) for c in (True, False))
        if got in causal:
            continue
        what = _("without the causal mask") if got in plain and not set(plain) & set(causal) else _("on something else")
        findings.append(found(Pitfall.MASK, _("benchmark_attention measures {name} {what}").format(name=name, what=what),
                              _("benchmark_attention((32, 64), causal=True) records mask={conditions_get!r}, but {name} at T=64 saved "
                                "{got:,d} bytes{how}; with is_causal=True it saves {causal:,d}.").format(
                                  conditions_get=conditions.get('mask'), name=name, got=got, how=how_off(got, causal[0]),
                                  causal=causal[0]),
                              fix=_("pass causal on to both paths: fn(q, k, v, causal)")))
    return findings


def diagnose_tasks(namespace: dict[str, Any], only: Iterable[str] | None = None) -> dict[str, list[Finding]]:
    """``{grade_id: findings}`` about the student's ex06 functions in ``namespace``: the named checks, the task's mutants
    (:mod:`.mutants.ex06`), then the judges on fresh inputs for every task without a finding. Never raises."""
    return explained(namespace, PROBES, {
        "ex06_saved": lambda: check_parts(namespace, [("saved_tensor_bytes", _diagnose_saved)]),
        "ex06_bench": lambda: check_parts(namespace, [("benchmark_attention", lambda fn: _diagnose_bench(fn, namespace))])}, only=only)


def diagnose(namespace: dict[str, Any]) -> list[Finding]:
    """Findings about the student's ex06 functions in ``namespace`` (empty when all looks right); see :func:`diagnose_tasks`."""
    return flat(diagnose_tasks(namespace))


# ---- probes: the judges' inputs, drawn afresh on the student's machine --------------------------


def _probe_saved(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    b, h, t, d = (int(torch.randint(lo, hi, (), generator=gen)) for lo, hi in ((1, 3), (1, 3), (8, 48), (2, 12)))
    q, k, v = _qkv(b, h, t, d)
    fn, paths = ns["saved_tensor_bytes"], _paths()
    value = {"explicit": fn(paths["explicit"], q, k, v), "explicit_causal": fn(paths["explicit"], q, k, v, True),
             "sdpa": fn(paths["sdpa"], q, k, v), "exp": fn(lambda z: z.exp(), q)}
    return value, {"batch": b, "heads": h, "tokens": t, "head_dim": d}


def _probe_bench(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    import json

    if not isinstance(ns.get("results"), dict):
        raise NotImplementedError  # the benchmark cell has not produced results: the diagnosis says so
    t, heads, head_dim = (int(torch.randint(lo, hi, (), generator=gen)) for lo, hi in ((12, 33), (1, 3), (2, 9)))
    ts = [t, 2 * t, 4 * t]
    with swapped(ns, saved_tensor_bytes=saved_bytes):
        fresh = ns["benchmark_attention"](ts, batch=1, heads=heads, head_dim=head_dim, dtype=torch.float32, causal=True,
                                          warmup=0, repeats=1, device="cpu")
    value = json.loads(json.dumps({"main": ns["results"], "fresh": fresh}, default=str))
    return value, {"ts": ts, "heads": heads, "head_dim": head_dim}


PROBES: dict[str, Probe] = {"ex06_saved": _probe_saved, "ex06_bench": _probe_bench}
