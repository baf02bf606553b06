"""Exercise 12's mutants: RoPE's rotation, a cached RoPE decode step, ALiBi's bias and a left-padded batch's positions
(see :mod:`.`). ALiBi's "bias without the causal mask" is no mistake here: the task leaves the keys after a query
unchecked (a causal mask removes them), so that bias is the reference, and one masking them with -inf is another correct
solution. "The distance j - i" and "the slope's sign flipped" are one mistake: both give +m_h · (p_i - j)."""

from __future__ import annotations

import math
from typing import Any

from tinytf.checks import Pitfall

from ....translation import N_
from . import Correct, Family, Mutant

# ---- part A: rope ---------------------------------------------------------------------------------------------

_THETA = "theta = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)"
_ANGLES = "angles = positions.to(device=x.device, dtype=torch.float32)[:, None] * theta"
_LAYOUT = "angles = torch.cat([angles, angles], dim=-1)"
_TABLES = "cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)"
_TURN = "x_a, x_b = x.chunk(2, dim=-1)\n    return x * cos + torch.cat([-x_b, x_a], dim=-1) * sin"


def _rope_facts(value: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """The sizes and positions of the probe's inputs, and what bfloat16 makes of the first far position."""
    import torch

    d = int(inputs["near"].size(-1))
    start, first = int(inputs["far_positions"][0]), int(inputs["near_positions"][0])
    t = int(inputs["near"].size(-2))
    return {"d": d, "half": d // 2, "start": start, "first": first, "t": t, "last": t - 1,
            "first_last": first + t - 1, "rounded": int(torch.tensor(float(start)).bfloat16().item()),
            "theta1": 10000.0 ** (-2 / d), "slow": 10000.0 ** (-(d - 2) / d), "theta1_got": 10000.0 ** (-1 / d),
            "slow_got": 10000.0 ** ((d - 2) / d)}


ROPE = Family(
    task="ex12_rope", cell="ex12_rope_code", subject="rope",
    source=("def rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:\n"
            "    d = x.size(-1)\n"
            f"    {_THETA}\n"
            f"    {_ANGLES}\n"
            f"    {_LAYOUT}\n"
            f"    {_TABLES}\n"
            f"    {_TURN}\n"),
    mutants=(
        Mutant("interleaved", Pitfall.ROPE_LAYOUT, N_("rope pairs channels (2i, 2i + 1): the interleaved layout"),
               N_("your output is RoPE's interleaved rotation (RoFormer, GPT-J): channel 0 turns with channel 1, channel 2 with "
                  "channel 3 …; the half-split layout asked for pairs channel i with channel i + d/2 (0 with {half} for d = {d})."),
               N_("pair channel i with channel i + d/2: x_a, x_b = x.chunk(2, dim=-1), rotate_half(x) = [-x_b, x_a], cos and sin "
                  "laid out [φ, φ] (for weights trained interleaved, permute W_q and W_k inside each head instead)"),
               facts=_rope_facts,
               edits=((_LAYOUT, "angles = angles.repeat_interleave(2, dim=-1)"),
                      (_TURN, "x_a, x_b = x[..., 0::2], x[..., 1::2]\n"
                              "    return x * cos + torch.stack([-x_b, x_a], dim=-1).flatten(-2) * sin"))),
        Mutant("wrong_way", Pitfall.GENERAL, N_("the rotation turns the wrong way"),
               N_("your output is the reference's rotation at the negated positions, rope(x, -positions): every pair turns by "
                  "-position · θ because the rotate_half(x) · sin term is subtracted."),
               N_("add the quarter turn: x · cos + rotate_half(x) · sin, with rotate_half(x) = [-x_b, x_a]"),
               edits=(("return x * cos + torch.cat", "return x * cos - torch.cat"),)),
        Mutant("positions_ignored", Pitfall.DECODE_AT_ZERO, N_("rope ignores the positions it is given"),
               N_("your rows are rotated at 0 … {last} whatever the positions: rope(x) at positions {first} … {first_last} equals "
                  "the reference at positions 0 … {last}, so a decode step after a cache would be rotated at 0."),
               N_("rotate row t at positions[t]: angles = positions[:, None] · θ, not arange(T)"), facts=_rope_facts,
               edits=(("positions.to(device=x.device, dtype=torch.float32)",
                       "torch.arange(x.size(-2), device=x.device, dtype=torch.float32)"),)),
        Mutant("angles_bfloat16", Pitfall.LOW_PRECISION_ANGLES, N_("the angles are computed in bfloat16"),
               N_("your rotation is right near position 0 and whole radians off far away: in bfloat16 position {start} becomes "
                  "{rounded} (8 bits of precision), and position · θ with it."),
               N_("build position · θ, cos and sin in float32; cast only the tables to the model's dtype"), facts=_rope_facts,
               edits=((_ANGLES, "angles = positions.to(device=x.device, dtype=torch.bfloat16)[:, None] * theta.to(torch.bfloat16)"),)),
        Mutant("angles_in_x_dtype", Pitfall.LOW_PRECISION_ANGLES, N_("the angles are computed in x's dtype"),
               N_("your rotation is right for a float32 x, and for a bfloat16 x at positions {start} … it is whole radians off: θ "
                  "and position · θ are built in bfloat16, where position {start} becomes {rounded}."),
               N_("build position · θ, cos and sin in float32; cast only the tables to the model's dtype"), facts=_rope_facts,
               edits=(("dtype=torch.float32, device=x.device", "dtype=x.dtype, device=x.device"),
                      ("dtype=torch.float32)[:, None]", "dtype=x.dtype)[:, None]"))),
        Mutant("float32_result", Pitfall.GENERAL, N_("rope returns float32 for a bfloat16 x"),
               N_("your values are right, but for a bfloat16 x the result is float32: cos and sin stay float32, so x · cos is "
                  "promoted to float32."),
               N_("cast the float32 tables to x's dtype before the product: angles.cos().to(x.dtype), angles.sin().to(x.dtype)"),
               edits=((_TABLES, "cos, sin = angles.cos(), angles.sin()"),)),
        Mutant("exponent_per_pair", Pitfall.GENERAL, N_("the frequencies are θ_i = base^(-i/d)"),
               N_("your pair i turns at base^(-i/d) rad per position: pair 1 at {theta1_got:.4g} instead of base^(-2/d) = "
                  "{theta1:.4g} for d = {d}; the exponent counts channels (2i), not pairs."),
               N_("θ_i = base^(-2i/d): torch.arange(0, d, 2) / d"), facts=_rope_facts,
               edits=(("torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d",
                       "torch.arange(0, d // 2, dtype=torch.float32, device=x.device) / d"),)),
        Mutant("theta_not_inverted", Pitfall.GENERAL, N_("the frequencies grow: θ_i = base^(+2i/d)"),
               N_("your last pair turns {slow_got:.4g} rad per position instead of base^(-(d - 2)/d) = {slow:.2g} for d = {d}: θ is "
                  "base to the plus 2i/d, not its inverse."),
               N_("θ_i = 1 / base^(2i/d): theta = 1.0 / base ** (torch.arange(0, d, 2) / d)"), facts=_rope_facts,
               edits=(("theta = 1.0 / base **", "theta = base **"),)),
        Mutant("halves_not_swapped", Pitfall.GENERAL, N_("rotate_half negates without swapping the halves"),
               N_("your rotate_half(x) is [-x_a, x_b], not [-x_b, x_a]: each channel is scaled by cos φ ∓ sin φ instead of turned "
                  "with its partner i + d/2, so the lengths of q and k change with the position."),
               N_("rotate_half(x) = [-x_b, x_a]: the second half, negated, comes first"),
               edits=(("torch.cat([-x_b, x_a], dim=-1)", "torch.cat([-x_a, x_b], dim=-1)"),)),
    ),
    correct=(Correct("complex", edits=((_TURN, "x_a, x_b = x.float().chunk(2, dim=-1)\n"
                                               "    z = torch.complex(x_a, x_b) * torch.polar(torch.ones_like(angles[..., :d // 2]), "
                                               "angles[..., :d // 2])\n"
                                               "    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)"),)),
             Correct("per_half", edits=((_TURN, "c, s = cos[..., :d // 2], sin[..., :d // 2]\n"
                                                "    x_a, x_b = x.chunk(2, dim=-1)\n"
                                                "    return torch.cat([x_a * c - x_b * s, x_b * c + x_a * s], dim=-1)"),))),
)

# ---- part B: rope_decode_step ---------------------------------------------------------------------------------

_POS = "positions = torch.arange(past, past + t)"
_ROT = "q, k = rope(q, positions), rope(k, positions)"
_CAT = "k_cache, v_cache = torch.cat([k_cache, k], dim=-2), torch.cat([v_cache, v], dim=-2)"
_SCORES = "scores = q @ k_cache.transpose(-2, -1) / math.sqrt(q.size(-1))"
_ALLOWED = "allowed = torch.ones(t, past + t, dtype=torch.bool).tril(diagonal=past)"
_OUT = 'out = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1) @ v_cache'
END_ALIGNED = N_("mask with the end-aligned causal mask: query i sits at past + i and sees keys 0 … past + i, "
                 "torch.ones(t, past + t).tril(diagonal=past)")


def _decode_facts(value: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    past = int(inputs["past"])
    chunk = inputs.get("chunk") or {}
    return {"past": past, "last": past - 1, "t": int(chunk["q"].size(-2)) if chunk else 2,
            "chunk_past": int(chunk.get("past", past)), "twice": 2 * (past - 1)}


DECODE = Family(
    task="ex12_decode", cell="ex12_decode_code", subject="rope_decode_step",
    source=("def rope_decode_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,\n"
            "                     past: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:\n"
            "    t = q.size(-2)\n"
            f"    {_POS}\n"
            f"    {_ROT}\n"
            f"    {_CAT}\n"
            f"    {_SCORES}\n"
            f"    {_ALLOWED}\n"
            f"    {_OUT}\n"
            "    return out, k_cache, v_cache\n"),
    mutants=(
        Mutant("at_zero", Pitfall.DECODE_AT_ZERO, N_("the new tokens are rotated at position 0"),
               N_("your query and new key are rotated at 0 … t - 1 instead of past … past + t - 1: after past = {past} cached "
                  "tokens the query sees the key at position {last} at offset -{last} instead of 1."),
               N_("rotate the new tokens at positions past … past + t - 1 (past = tokens already cached)"), facts=_decode_facts,
               edits=((_POS, "positions = torch.arange(t)"),)),
        Mutant("query_at_zero", Pitfall.DECODE_AT_ZERO, N_("the query is rotated at position 0"),
               N_("your new key is rotated at past = {past}, the query at 0 … t - 1: the query sees every cached key {past} "
                  "positions away from where it is."),
               N_("rotate the new tokens at positions past … past + t - 1 (past = tokens already cached)"), facts=_decode_facts,
               edits=((_ROT, "q, k = rope(q, torch.arange(t)), rope(k, positions)"),)),
        Mutant("v_rotated", Pitfall.ROPE_ON_V, N_("v is rotated too"),
               N_("your output mixes rotated values and v_cache holds the new value rotated at past = {past}: RoPE turns q and k "
                  "so that q · k sees their offset; v carries content."),
               N_("rotate q and k only; v stays as projected"), facts=_decode_facts,
               edits=((_ROT, "q, k, v = rope(q, positions), rope(k, positions), rope(v, positions)"),)),
        Mutant("cache_rotated_again", Pitfall.KEYS_ROTATED_TWICE, N_("the cached keys are rotated again"),
               N_("your step rotates the whole cache at 0 … past + t - 1 after appending: the cached keys, rotated when they "
                  "were cached, turn once more (key p by 2p · θ: key {last} as if at {twice}), and the returned cache keeps them "
                  "so."),
               N_("rotate each key once, at its absolute position, before it is written to the cache"), facts=_decode_facts,
               edits=((_CAT, "k_cache, v_cache = rope(torch.cat([k_cache, k], dim=-2), torch.arange(past + t)), "
                             "torch.cat([v_cache, v], dim=-2)"),)),
        Mutant("rotated_after_caching", Pitfall.KEYS_ROTATED_TWICE, N_("the new key is cached before it is rotated"),
               N_("your step appends the new key as projected and rotates the whole cache when it reads it: the new key is right "
                  "in the scores, the {past} cached keys (rotated when they were cached) turn a second time, and the returned "
                  "cache holds the new key unrotated."),
               N_("rotate each key once, at its absolute position, before it is written to the cache"), facts=_decode_facts,
               edits=((_ROT, "q = rope(q, positions)"),
                      (_SCORES, "scores = q @ rope(k_cache, torch.arange(past + t)).transpose(-2, -1) / math.sqrt(q.size(-1))"))),
        Mutant("start_aligned_mask", Pitfall.CAUSAL_OFF_BY_ONE, N_("the causal mask is aligned to the start"),
               N_("your mask lets query i see keys 0 … i, as if the new tokens stood at 0 … t - 1: after past = {past} cached "
                  "tokens the decode step's query sees only key 0."),
               END_ALIGNED, facts=_decode_facts,
               edits=((_ALLOWED, "allowed = torch.ones(t, past + t, dtype=torch.bool).tril()"),)),
        Mutant("no_mask", Pitfall.CAUSAL_OFF_BY_ONE, N_("the new tokens see each other's future"),
               N_("your step has no causal mask: right for one new token, but with t = {t} new tokens after past = {chunk_past} "
                  "each also sees the new tokens after it."),
               END_ALIGNED, facts=_decode_facts,
               edits=((_OUT, "out = scores.softmax(dim=-1) @ v_cache"),)),
        Mutant("unscaled", Pitfall.SCALE, N_("rope_decode_step does not scale the scores"),
               N_("your scores are q @ kᵀ without the division by sqrt(d)."), N_("divide the scores by math.sqrt(q.size(-1))"),
               edits=((_SCORES, "scores = q @ k_cache.transpose(-2, -1)"),)),
    ),
    correct=(Correct("sdpa", edits=((_OUT, "out = torch.nn.functional.scaled_dot_product_attention(q, k_cache, v_cache, "
                                           "attn_mask=allowed)"),)),
             Correct("tinytf_mask", edits=((_ALLOWED, "allowed = tinytf.causal_mask(t, past + t)"),
                                           (_OUT, 'out = torch.where(allowed, scores, torch.tensor(float("-inf"))).softmax(dim=-1) '
                                                  "@ v_cache")))),
)

# ---- part C: alibi_bias and position_ids ----------------------------------------------------------------------

_SLOPES = "slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)])"
_P = "p = torch.arange(t_q)[:, None] + (t_k - t_q)"
_BIAS = "return -slopes[:, None, None] * (p - j).float()"
_REAL = "real = torch.arange(t)[None, :] >= (t - torch.tensor(lengths))[:, None]"
_IDS = "return (real.long().cumsum(dim=-1) - 1).clamp(min=0)"
SLOPES_FIX = N_("m_h = 2^(-8(h+1)/H) for h = 0 … H - 1: head 0 steepest (2^(-8/H)), the last head 2^-8")


def _powers(slopes: Any) -> str:
    """``[0.25, 0.0625]`` -> ``"2^-2, 2^-4"``."""
    return ", ".join(f"2^{math.log2(float(m)):.3g}" if float(m) > 0 else f"{float(m):.3g}" for m in slopes)


def _alibi_facts(value: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """The slopes the student's bias of the probe's first size shows (from its last query and key 0), the right ones,
    the sizes, and the first padded row's positions."""
    import torch

    from tinytf.alibi import alibi_slopes
    from tinytf.masks import padded_positions, padding_mask

    heads, t_q, t_k = inputs["sizes"][0]
    got = -value["bias"][0][:, -1, 0].float() / (t_k - 1)  # the last query sits at t_k - 1, key 0 is t_k - 1 back
    lengths, t = list(inputs["lengths"]), int(inputs["t"])
    row = len(lengths) - 1  # the probe's row of two real tokens, padded on the left
    real = padding_mask(lengths, t, side="left")[:, 0, 0, :][row]
    ids = value["positions"]
    return {"heads": heads, "t_q": t_q, "t_k": t_k, "got": _powers(got), "want": _powers(alibi_slopes(heads)),
            "length": lengths[row], "t": t, "pads": t - lengths[row],
            "ids": torch.as_tensor(ids)[row][real].tolist() if isinstance(ids, torch.Tensor) else "?",
            "right": padded_positions(lengths, t)[row][real].tolist()}


ALIBI = Family(
    task="ex12_alibi", cell="ex12_alibi_code", subject="alibi_bias / position_ids",
    source=("def alibi_bias(heads: int, t_q: int, t_k: int) -> torch.Tensor:\n"
            f"    {_SLOPES}\n"
            f"    {_P}\n"
            "    j = torch.arange(t_k)[None, :]\n"
            f"    {_BIAS}\n"
            "\n\n"
            "def position_ids(lengths: list[int], t: int) -> torch.Tensor:\n"
            f"    {_REAL}\n"
            f"    {_IDS}\n"),
    mutants=(
        Mutant("distance_reversed", Pitfall.ALIBI_BIAS, N_("the bias rewards distance"),
               N_("your bias is +m_h · (p_i - j), the reference with its sign flipped: the distance is taken as j - i (or the "
                  "minus dropped), so the farther the key, the higher its score."),
               N_("bias[h, i, j] = -m_h · (p_i - j) with p_i = t_k - t_q + i and m_h = 2^(-8(h+1)/H)"),
               edits=((_BIAS, "return -slopes[:, None, None] * (j - p).float()"),)),
        Mutant("start_aligned", Pitfall.ALIBI_BIAS, N_("the bias is aligned to the start"),
               N_("your query i sits at position i, not t_k - t_q + i: with t_q = {t_q} queries over t_k = {t_k} keys each row's "
                  "penalties are those of a query {shift} positions earlier, and a decode step's are those of position 0."),
               N_("bias[h, i, j] = -m_h · (p_i - j) with p_i = t_k - t_q + i and m_h = 2^(-8(h+1)/H)"),
               facts=lambda value, inputs: {**_alibi_facts(value, inputs), "shift": inputs["sizes"][0][2] - inputs["sizes"][0][1]},
               edits=((_P, "p = torch.arange(t_q)[:, None]"),)),
        Mutant("slopes_reversed", Pitfall.ALIBI_BIAS, N_("the slopes run the wrong way"),
               N_("your slopes for {heads} heads are {got}, the reference's in reverse head order ({want}): head 0 gets the "
                  "shallowest slope and the last head the steepest."), SLOPES_FIX, facts=_alibi_facts,
               edits=(("for h in range(heads)]", "for h in reversed(range(heads))]"),)),
        Mutant("slopes_one_early", Pitfall.ALIBI_BIAS, N_("the slopes start one head early"),
               N_("your slopes for {heads} heads are {got} = 2^(-8h/H), each the reference's of the head before ({want}): head 0 "
                  "gets a slope of 1."), SLOPES_FIX, facts=_alibi_facts,
               edits=(("2.0 ** (-8.0 * (h + 1) / heads)", "2.0 ** (-8.0 * h / heads)"),)),
        Mutant("slopes_for_8_heads", Pitfall.ALIBI_BIAS, N_("the slopes ignore the number of heads"),
               N_("your slopes for {heads} heads are {got} = 2^-(h+1), the rule for 8 heads; with {heads} heads they are "
                  "2^(-8(h+1)/{heads}) = {want}."), SLOPES_FIX, facts=_alibi_facts,
               edits=(("2.0 ** (-8.0 * (h + 1) / heads)", "2.0 ** (-(h + 1))"),)),
        Mutant("positions_from_pads", Pitfall.LEFT_PAD_OFFSET, N_("the positions are counted from the pads"),
               N_("your position_ids number every row 0 … t - 1, pads included: the row with {length} real tokens after {pads} "
                  "pads numbers them {ids}, not {right}."),
               N_("number each row's real tokens 0, 1, 2 … from its first real token (padded_positions)"), facts=_alibi_facts,
               edits=((_IDS, "return torch.arange(t).expand(len(lengths), t).clone()"),)),
        Mutant("positions_from_one", Pitfall.GENERAL, N_("the positions start at 1"),
               N_("your position_ids are the reference's plus one: the row with {length} real tokens numbers them {ids}, not "
                  "{right}."), N_("count from 0: cumsum(real) - 1"), facts=_alibi_facts,
               edits=((_IDS, "return real.long().cumsum(dim=-1)"),)),
        Mutant("padded_on_the_right", Pitfall.LEFT_PAD_OFFSET, N_("position_ids takes the pads to be on the right"),
               N_("your real tokens are the first lengths[b] of each row, where the batch is padded on the left: the row with "
                  "{length} real tokens after {pads} pads numbers them {ids}, not {right}."),
               N_("the real tokens are the last lengths[b] of each row: real = arange(t) >= t - lengths, numbered from the first "
                  "of them"), facts=_alibi_facts,
               edits=((_REAL, "real = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]"),)),
        Mutant("float_positions", Pitfall.GENERAL, N_("position_ids returns floats"),
               N_("your position ids have the right values as a floating-point tensor; an embedding table and padded_positions "
                  "index with integers."),
               N_("keep the ids integers: (real.long().cumsum(dim=-1) - 1).clamp(min=0)"),
               edits=((_IDS, "return (real.float().cumsum(dim=-1) - 1).clamp(min=0)"),)),
    ),
    correct=(Correct("loops", edits=((_BIAS, "bias = torch.zeros(heads, t_q, t_k)\n"
                                             "    for h in range(heads):\n"
                                             "        for i in range(t_q):\n"
                                             "            for k in range(t_k):\n"
                                             "                bias[h, i, k] = -slopes[h] * (t_k - t_q + i - k)\n"
                                             "    return bias"),
                                     (_IDS, "ids = torch.zeros(len(lengths), t, dtype=torch.long)\n"
                                            "    for b, n in enumerate(lengths):\n"
                                            "        ids[b, t - n:] = torch.arange(n)\n"
                                            "    return ids"))),
             Correct("masked_future", edits=((_BIAS, 'return (-slopes[:, None, None] * (p - j).float()).masked_fill(j > p, '
                                                     'float("-inf"))'),
                                             (_IDS, "return tinytf.masks.padded_positions(lengths, t)")))),
)

FAMILIES = (ROPE, DECODE, ALIBI)
