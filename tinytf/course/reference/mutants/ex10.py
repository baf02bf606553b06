"""Exercise 10's mutants: widening K/V heads, grouped-query attention, the cache's bytes, the sliding window
(see :mod:`.`)."""

from __future__ import annotations

from typing import Any

from tinytf.checks import Pitfall

from ....translation import N_
from . import Correct, Family, Mutant

INTERLEAVE = N_("query head h reads K/V head h // (heads // kv_heads): kv.repeat_interleave(heads // kv_heads, dim=1)")


def _order(value: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    kv, heads = inputs["kv"].size(1), int(inputs["heads"])
    groups = heads // kv
    return {"kv": kv, "heads": heads, "groups": groups, "tiled": [h % kv for h in range(heads)],
            "right": [h // groups for h in range(heads)], "by_kv": [h // kv for h in range(heads)]}


_EXPAND = "return kv.repeat_interleave(groups, dim=1)"

EXPAND = Family(
    task="ex10_expand", cell="ex10_expand_code", subject="expand_kv",
    source=("def expand_kv(kv: torch.Tensor, heads: int) -> torch.Tensor:\n"
            "    groups = heads // kv.size(1)\n"
            f"    {_EXPAND}\n"),
    mutants=(
        Mutant("repeat", Pitfall.KV_GROUPING, N_("expand_kv tiles the K/V heads (repeat, not repeat_interleave)"),
               N_("your query heads 0 … {heads} - 1 get K/V heads {tiled} (kv.repeat: k0 k1 k0 k1, e.g. [0, 1, 0, 1] for 2 K/V "
                  "heads and 4 query heads); head h must get K/V head h // {groups}: {right}."), INTERLEAVE, facts=_order,
               edits=((_EXPAND, "return kv.repeat(1, groups, 1, 1)"),)),
        Mutant("time_axis", Pitfall.ORIENTATION, N_("expand_kv repeats along time"),
               N_("your result repeats each token {groups} times along dim 2, the time axis: the heads stay {kv}, the sequence "
                  "grows."), INTERLEAVE, facts=_order, edits=((_EXPAND, "return kv.repeat_interleave(groups, dim=2)"),)),
        Mutant("groups_inverted", Pitfall.KV_GROUPING, N_("expand_kv repeats each K/V head kv_heads times"),
               N_("your result repeats each of the {kv} K/V heads {kv} times (kv.size(1)), not heads // kv_heads = {groups} times."),
               INTERLEAVE, facts=_order, edits=(("groups = heads // kv.size(1)", "groups = kv.size(1)"),)),
        Mutant("first_head_only", Pitfall.KV_GROUPING, N_("expand_kv gives every query head K/V head 0"),
               N_("your result copies K/V head 0 to all {heads} query heads, as multi-query attention would; with {kv} K/V heads "
                  "head h reads K/V head h // {groups}: {right}."), INTERLEAVE, facts=_order,
               edits=((_EXPAND, "return kv[:, :1].expand(-1, heads, -1, -1)"),)),
        Mutant("divided_by_kv_heads", Pitfall.KV_GROUPING, N_("expand_kv groups by kv_heads, not by heads // kv_heads"),
               N_("your query heads get K/V heads {by_kv} (h // kv_heads); head h reads K/V head h // (heads // kv_heads): {right}."),
               INTERLEAVE, facts=_order, edits=((_EXPAND, "return kv[:, torch.arange(heads) // kv.size(1)]"),)),
    ),
    correct=(Correct("index_lists", edits=((_EXPAND, "return kv[:, [h // groups for h in range(heads)]]"),)),
             Correct("expand_reshape", edits=((_EXPAND, "b, g, t, d = kv.shape\n    return kv[:, :, None].expand(b, g, groups, t, d)"
                                                        ".reshape(b, g * groups, t, d)"),))),
)

_WIDEN = "k, v = expand_kv(k, heads), expand_kv(v, heads)"
_SCORES = "scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))"

GROUPED = Family(
    task="ex10_grouped", cell="ex10_grouped_code", subject="grouped_attention",
    source=("def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:\n"
            "    heads, kv_heads = q.size(1), k.size(1)\n"
            "    if heads % kv_heads:\n"
            "        raise ValueError(f\"grouped_attention: kv_heads={kv_heads} does not divide heads={heads}; \"\n"
            "                         f\"every K/V head must serve the same number of query heads\")\n"
            f"    {_WIDEN}\n"
            f"    {_SCORES}\n"
            "    if mask is not None:\n"
            "        scores = scores.masked_fill(~mask, float(\"-inf\"))\n"
            "    return torch.softmax(scores, dim=-1) @ v\n"),
    mutants=(
        Mutant("repeat_order", Pitfall.KV_GROUPING, N_("grouped_attention widens K/V with the order of repeat"),
               N_("your output pairs query head h with K/V head h % kv_heads (kv.repeat tiles the heads): right only when "
                  "kv_heads = 1 or kv_heads = H, wrong in between."),
               INTERLEAVE, edits=((_WIDEN, "k, v = k.repeat(1, heads // kv_heads, 1, 1), v.repeat(1, heads // kv_heads, 1, 1)"),)),
        Mutant("no_value_error", Pitfall.GENERAL, N_("grouped_attention does not check that kv_heads divides H"),
               N_("with a kv_heads that does not divide H your function raises no ValueError of its own (it fails later, inside "
                  "the arithmetic, or not at all)."),
               N_("raise ValueError naming both counts when heads % kv_heads != 0"), edits=(("if heads % kv_heads:", "if False:"),)),
        Mutant("unscaled", Pitfall.SCALE, N_("grouped_attention does not scale the scores"),
               N_("your output is softmax(q kᵀ) v: the scores are not divided by sqrt(d)."),
               N_("divide the scores by math.sqrt(q.size(-1))"), edits=((_SCORES, "scores = q @ k.transpose(-2, -1)"),)),
        Mutant("mask_ignored", Pitfall.MASK, N_("grouped_attention ignores the mask"),
               N_("with a causal mask your output equals the output without it: every query also sees later keys."),
               N_("fill the blocked scores with -inf before the softmax: scores.masked_fill(~mask, float('-inf'))"),
               edits=(('scores = scores.masked_fill(~mask, float("-inf"))', "scores = scores"),)),
        Mutant("values_not_widened", Pitfall.KV_GROUPING, N_("grouped_attention widens the keys but not the values"),
               N_("your values keep their kv_heads heads while the weights have H: the product fails, or pairs the wrong heads."),
               INTERLEAVE, edits=((_WIDEN, "k, v = expand_kv(k, heads), v"),)),
    ),
    correct=(Correct("einsum", edits=(("return torch.softmax(scores, dim=-1) @ v",
                                       'return torch.einsum("bhqk,bhkd->bhqd", torch.softmax(scores, dim=-1), v)'),)),
             Correct("where_mask", edits=(('scores = scores.masked_fill(~mask, float("-inf"))',
                                           'scores = torch.where(mask, scores, torch.tensor(float("-inf")))'),))),
)

_FORMULA = "return 2 * layers * batch * kv_heads * kept * head_dim * dtype_bytes"
_KEPT = "kept = tokens if window is None else min(tokens, window)"

CACHE = Family(
    task="ex10_cache", cell="ex10_cache_code", subject="cache_bytes",
    source=("def cache_bytes(batch: int, layers: int, kv_heads: int, head_dim: int, tokens: int, dtype_bytes: int, "
            "window: int | None = None) -> int:\n"
            f"    {_KEPT}\n"
            f"    {_FORMULA}\n"),
    mutants=(
        Mutant("keys_only", Pitfall.KV_CACHE, N_("only the keys are counted"),
               N_("your cache_bytes is exactly half the right size: the cache holds keys and values."),
               N_("count keys and values: start the formula with 2 ·"), edits=((_FORMULA, _FORMULA.replace("return 2 * ", "return ")),)),
        Mutant("window_ignored", Pitfall.GENERAL, N_("the window does not cap the cache"),
               N_("your count keeps every token even with a window shorter than the sequence; a rolling cache keeps min(tokens, "
                  "window) tokens per layer."),
               N_("count min(tokens, window) tokens when a window is given"), edits=((_KEPT, "kept = tokens"),)),
        Mutant("window_always", Pitfall.GENERAL, N_("the window is used even when the sequence is shorter"),
               N_("your count keeps window tokens even when fewer were written: a cache never holds more tokens than it was given."),
               N_("count min(tokens, window) tokens, not window"), edits=((_KEPT, "kept = tokens if window is None else window"),)),
        Mutant("dtype_ignored", Pitfall.GENERAL, N_("dtype_bytes is ignored"),
               N_("your count assumes 2 bytes per number: exactly half for a 4-byte dtype (and right for 2 bytes): dtype_bytes=4 "
                  "looks ignored."),
               N_("multiply by dtype_bytes instead of a fixed 2"), edits=((_FORMULA, _FORMULA.replace("* dtype_bytes", "* 2")),)),
        Mutant("batch_ignored", Pitfall.GENERAL, N_("cache_bytes counts one sequence"),
               N_("your count leaves out batch: every sequence of the batch has its own keys and values."),
               N_("multiply by batch"), edits=((_FORMULA, _FORMULA.replace("* batch ", "")),)),
        Mutant("float_bytes", Pitfall.GENERAL, N_("cache_bytes returns a float"),
               N_("your count is a float; a number of bytes is an int."), N_("keep the arithmetic in ints: no / and no float factors"),
               edits=((_FORMULA, _FORMULA.replace("return 2 * ", "return 2.0 * ")),)),
    ),
    correct=(Correct("if_window", edits=((_KEPT, "kept = tokens\n    if window is not None and window < tokens:\n        kept = window"),)),
             Correct("per_token", edits=((_FORMULA, "per_token = 2 * kv_heads * head_dim * dtype_bytes\n"
                                                    "    return per_token * kept * layers * batch"),))),
)


def _seen(value: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    from tinytf import causal_mask

    t_q, t_k, window = inputs["sizes"][0]
    return {"seen": value[0].sum(-1).tolist(), "should": causal_mask(t_q, t_k, window=window).sum(-1).tolist(), "window": window,
            "t_q": t_q, "t_k": t_k}


_BAND = "return (j <= p) & (j > p - window)"
WINDOW_FIX = N_("the query at position p sees keys p - window + 1 … p: causal_mask(t_q, t_k, window=window)")

WINDOW = Family(
    task="ex10_window", cell="ex10_window_code", subject="sliding_window_mask",
    source=("def sliding_window_mask(t_q: int, t_k: int, window: int) -> torch.Tensor:\n"
            "    p = torch.arange(t_q)[:, None] + (t_k - t_q)\n"
            "    j = torch.arange(t_k)[None, :]\n"
            f"    {_BAND}\n"),
    mutants=(
        Mutant("window_minus_one", Pitfall.WINDOW_OFF_BY_ONE, N_("the window lets each query see window - 1 keys"),
               N_("Keys seen per query with window = {window}: {seen}, should be {should}: the band stops one key short (j > p - "
                  "window + 1), so a full window holds window - 1 keys."), WINDOW_FIX, facts=_seen,
               edits=((_BAND, "return (j <= p) & (j > p - window + 1)"),)),
        Mutant("window_plus_one", Pitfall.WINDOW_OFF_BY_ONE, N_("the window lets each query see window + 1 keys"),
               N_("Keys seen per query with window = {window}: {seen}, should be {should}: the band reaches one key too far back "
                  "(j >= p - window), so a full window holds window + 1 keys; the window counts the query itself."), WINDOW_FIX,
               facts=_seen, edits=((_BAND, "return (j <= p) & (j >= p - window)"),)),
        Mutant("not_causal", Pitfall.CAUSAL_OFF_BY_ONE, N_("the window looks ahead"),
               N_("your mask keeps only the lower edge of the band: each query also sees every key after it."), WINDOW_FIX,
               edits=((_BAND, "return j > p - window"),)),
        Mutant("start_aligned", Pitfall.CAUSAL_OFF_BY_ONE, N_("the window is START-aligned"),
               N_("your query i sits at position i, not t_k - t_q + i: with t_k = {t_k} > t_q = {t_q} each query's band ends "
                  "before its own position."), WINDOW_FIX, facts=lambda value, inputs: dict(zip(("t_q", "t_k"), inputs["sizes"][1][:2])),
               edits=(("p = torch.arange(t_q)[:, None] + (t_k - t_q)", "p = torch.arange(t_q)[:, None]"),)),
        Mutant("inverted", Pitfall.MASK, N_("the window mask is inverted"),
               N_("your mask is True outside the band and False inside it: True must mean may attend."),
               N_("return the band itself, (j <= p) & (j > p - window), not its complement"),
               edits=((_BAND, "return ~((j <= p) & (j > p - window))"),)),
    ),
    correct=(Correct("tinytf", edits=((_BAND, "return tinytf.causal_mask(t_q, t_k, window=window)"),)),
             Correct("distance", edits=((_BAND, "return (p - j >= 0) & (p - j < window)"),))),
)

FAMILIES = (EXPAND, GROUPED, CACHE, WINDOW)
