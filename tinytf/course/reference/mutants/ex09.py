"""Exercise 9's mutants: the online-softmax update, tiled attention, its memory, causal tiles (see :mod:`.`)."""

from __future__ import annotations

from tinytf.checks import Pitfall

from ....translation import N_
from . import Correct, Family, Mutant

_RET = "return m_new, alpha * l + p.sum(dim=-1, keepdim=True), alpha * acc + p @ v"
_SAFE = 'm_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)'
RESCALE = N_("alpha = exp(m - m_new); l = alpha * l + p.sum(-1), acc = alpha * acc + p @ v")

UPDATE = Family(
    task="ex09_update", cell="ex09_update_code", subject="online_softmax_update",
    source=("def online_softmax_update(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, scores: torch.Tensor, v: torch.Tensor) "
            "-> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:\n"
            "    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))\n"
            f"    {_SAFE}\n"
            "    p = torch.exp(scores - m_safe)\n"
            "    alpha = torch.exp(m - m_safe)\n"
            f"    {_RET}\n"),
    mutants=(
        Mutant("acc_not_rescaled", Pitfall.ACC_NOT_RESCALED, N_("the accumulator is not rescaled: acc (l is right)"),
               N_("your acc adds each tile's p @ v without first multiplying the old acc by alpha = exp(m - m_new): right while the "
                  "first tile holds the row's maximum, too large once a later tile raises it; l is rescaled."),
               N_("acc = alpha * acc + p @ v, with alpha = exp(m - m_new)"),
               edits=((_RET, "return m_new, alpha * l + p.sum(dim=-1, keepdim=True), acc + p @ v"),)),
        Mutant("l_not_rescaled", Pitfall.ACC_NOT_RESCALED, N_("the running sum is not rescaled: l (acc is right)"),
               N_("your l adds each tile's p.sum() without first multiplying the old l by alpha = exp(m - m_new); acc is "
                  "rescaled, so acc / l comes out too small once a later tile raises the maximum."),
               N_("l = alpha * l + p.sum(dim=-1, keepdim=True), with alpha = exp(m - m_new)"),
               edits=((_RET, "return m_new, l + p.sum(dim=-1, keepdim=True), alpha * acc + p @ v"),)),
        Mutant("neither_rescaled", Pitfall.ACC_NOT_RESCALED, N_("neither l nor acc is rescaled"),
               N_("your l and acc add each tile's terms without multiplying the old sums by alpha = exp(m - m_new): they mix "
                  "exponentials taken against different maxima."), RESCALE,
               edits=((_RET, "return m_new, l + p.sum(dim=-1, keepdim=True), acc + p @ v"),)),
        Mutant("masked_tile_nan", Pitfall.MASKED_TILE_NAN, N_("a fully masked tile gives NaN (-inf - -inf)"),
               N_("your update subtracts m_new itself: for a row whose tiles so far were all masked m_new is -inf, and "
                  "exp(-inf - -inf) = exp(NaN) poisons l and acc."),
               N_("subtract m_new.masked_fill(m_new == -inf, 0): the rows that saw only masked scores subtract 0"),
               edits=((_SAFE, "m_safe = m_new"),)),
        Mutant("alpha_inverted", Pitfall.ACC_NOT_RESCALED, N_("the rescale factor is inverted"),
               N_("your alpha is exp(m_new - m), the inverse of exp(m - m_new): the old sums grow when they should shrink."),
               RESCALE, edits=(("alpha = torch.exp(m - m_safe)", "alpha = torch.exp(m_safe - m)"),)),
        Mutant("tile_max", Pitfall.GENERAL, N_("m is the tile's maximum, not the running maximum"),
               N_("your m_new is this tile's own maximum: the running maximum must never decrease, max(m, this tile's maximum)."),
               N_("m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))"),
               edits=(("m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))", "m_new = scores.amax(dim=-1, keepdim=True)"),)),
    ),
    correct=(Correct("where", edits=((_SAFE, 'm_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)'),)),
             Correct("einsum", edits=((_RET, 'return m_new, alpha * l + p.sum(dim=-1, keepdim=True), alpha * acc + '
                                            'torch.einsum("...qk,...kd->...qd", p, v)'),))),
)

_OUT = "out[..., q0:q1, :] = acc / l.masked_fill(l == 0, 1.0)"
_S = "s = q_i @ k[..., k0:k1, :].transpose(-2, -1)"
_TILED = ("def tiled_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *, block_q: int, "
          "block_k: int) -> torch.Tensor:\n"
          "    t_q, t_k = q.size(-2), k.size(-2)\n"
          "    out = q.new_zeros(*q.shape[:-1], v.size(-1))\n"
          "    for q0 in range(0, t_q, block_q):\n"
          "        q1 = min(q0 + block_q, t_q)\n"
          "        q_i = q[..., q0:q1, :] / math.sqrt(q.size(-1))\n"
          "        m = q.new_full((*q.shape[:-2], q1 - q0, 1), float(\"-inf\"))\n"
          "        l = torch.zeros_like(m)\n"
          "        acc = q.new_zeros(*q.shape[:-2], q1 - q0, v.size(-1))\n"
          "        for k0 in range(0, t_k, block_k):\n"
          "            k1 = min(k0 + block_k, t_k)\n"
          f"            {_S}\n"
          "            if mask is not None:\n"
          "                s = s.masked_fill(~mask_tile(mask, q0, q1, k0, k1), float(\"-inf\"))\n"
          "            m, l, acc = online_softmax_update(m, l, acc, s, v[..., k0:k1, :])\n"
          f"        {_OUT}\n"
          "    return out\n")

TILED = Family(
    task="ex09_tiled", cell="ex09_tiled_code", subject="tiled_forward", source=_TILED,
    mutants=(
        Mutant("no_final_division", Pitfall.NO_FINAL_DIVISION, N_("the output is not divided by l"),
               N_("your output is acc itself: the weighted sum of values, not yet divided by the sum of the weights l."),
               N_("divide acc / l once, after the last key tile"), edits=((_OUT, "out[..., q0:q1, :] = acc"),)),
        Mutant("empty_row_nan", Pitfall.MASKED_TILE_NAN, N_("a row that may see nothing gives 0 / 0"),
               N_("your output divides acc by l everywhere: a row that may see no key has l = 0 and comes out 0 / 0 = NaN."),
               N_("divide by l only where l > 0: acc / l.masked_fill(l == 0, 1.0)"),
               edits=((_OUT, "out[..., q0:q1, :] = acc / l"),)),
        Mutant("mask_ignored", Pitfall.MASK, N_("tiled_forward ignores the mask"),
               N_("with a mask your output equals the output without it: the tiles' scores are never filled with -inf."),
               N_("mask each tile's scores with -inf before the update: s.masked_fill(~mask_tile(mask, q0, q1, k0, k1), -inf)"),
               edits=(('s = s.masked_fill(~mask_tile(mask, q0, q1, k0, k1), float("-inf"))', "s = s"),)),
        Mutant("unscaled", Pitfall.SCALE, N_("tiled_forward does not scale the scores"),
               N_("your output is softmax(q kᵀ) v: the query blocks are not divided by sqrt(d)."),
               N_("scale each query block by 1 / math.sqrt(q.size(-1))"),
               edits=(("q_i = q[..., q0:q1, :] / math.sqrt(q.size(-1))", "q_i = q[..., q0:q1, :]"),)),
        Mutant("last_q_block", Pitfall.GENERAL, N_("tiled_forward overruns the last query block"),
               N_("your last query block assumes block_q rows: when Tq is not a multiple of block_q the statistics and the block "
                  "differ in size."),
               N_("end each query block at q1 = min(q0 + block_q, Tq)"),
               edits=(("q1 = min(q0 + block_q, t_q)", "q1 = q0 + block_q"),)),
    ),
    correct=(Correct("einsum_scores", edits=((_S, 's = torch.einsum("...qd,...kd->...qk", q_i, k[..., k0:k1, :])'),)),
             Correct("where_division", edits=((_OUT, "out[..., q0:q1, :] = torch.where(l > 0, acc / l.clamp_min(1e-30), 0.0)"),))),
    affects=("ex09_memory",),
)

MEMORY = Family(
    task="ex09_memory", cell="ex09_tiled_code", subject="tiled_forward", source=_TILED,
    mutants=(
        Mutant("full_scores", Pitfall.EXPLICIT_IN_PRODUCTION, N_("tiled_forward builds the whole score matrix"),
               N_("your tiles are slices of q @ kᵀ computed once for every query and key: its peak holds the whole [B, H, Tq, Tk] "
                  "score matrix that tiling exists to avoid."),
               N_("compute the scores q_i @ k_jᵀ per tile inside the loop"),
               edits=(("    out = q.new_zeros(*q.shape[:-1], v.size(-1))",
                       "    out = q.new_zeros(*q.shape[:-1], v.size(-1))\n"
                       "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))"),
                      (_S, "s = scores[..., q0:q1, k0:k1]"))),
        Mutant("tiles_kept", Pitfall.EXPLICIT_IN_PRODUCTION, N_("tiled_forward keeps every tile"),
               N_("your loop keeps each tile's scores in a list: by the end the tiles add up to the whole score matrix."),
               N_("let each tile's scores go after its update: keep only m, l and acc between tiles"),
               edits=(("    out = q.new_zeros(*q.shape[:-1], v.size(-1))",
                       "    out = q.new_zeros(*q.shape[:-1], v.size(-1))\n    kept = []"),
                      (_S, _S + "\n            kept.append(s)"))),
    ),
    affects=("ex09_tiled",),
    correct=(Correct("einsum_scores", edits=((_S, 's = torch.einsum("...qd,...kd->...qk", q_i, k[..., k0:k1, :])'),)),
             Correct("tile_then_scale", edits=(("q_i = q[..., q0:q1, :] / math.sqrt(q.size(-1))", "q_i = q[..., q0:q1, :]"),
                                               (_S, _S + " / math.sqrt(q.size(-1))")))),
)

_ALLOWED = "allowed = torch.arange(k0, k1, device=q.device)[None, :] <= q_pos"
_UPDATE = 'm, l, acc = online_softmax_update(m, l, acc, s.masked_fill(~allowed, float("-inf")), v[..., k0:k1, :])'
END_ALIGNED = N_("mask with positions: key j is seen by query i iff j <= Tk - Tq + i; skip only key blocks starting at or after "
                 "Tk - Tq + q1")

CAUSAL = Family(
    task="ex09_causal", cell="ex09_causal_code", subject="causal_tiled_forward",
    source=("def causal_tiled_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, block_q: int, block_k: int) -> "
            "tuple[torch.Tensor, int]:\n"
            "    t_q, t_k = q.size(-2), k.size(-2)\n"
            "    offset = t_k - t_q\n"
            "    out = q.new_zeros(*q.shape[:-1], v.size(-1))\n"
            "    computed = 0\n"
            "    for q0 in range(0, t_q, block_q):\n"
            "        q1 = min(q0 + block_q, t_q)\n"
            "        q_i = q[..., q0:q1, :] / math.sqrt(q.size(-1))\n"
            "        m = q.new_full((*q.shape[:-2], q1 - q0, 1), float(\"-inf\"))\n"
            "        l = torch.zeros_like(m)\n"
            "        acc = q.new_zeros(*q.shape[:-2], q1 - q0, v.size(-1))\n"
            "        q_pos = torch.arange(q0, q1, device=q.device)[:, None] + offset\n"
            "        for k0 in range(0, offset + q1, block_k):\n"
            "            k1 = min(k0 + block_k, t_k)\n"
            "            s = q_i @ k[..., k0:k1, :].transpose(-2, -1)\n"
            f"            {_ALLOWED}\n"
            f"            {_UPDATE}\n"
            "            computed += 1\n"
            "        out[..., q0:q1, :] = acc / l.masked_fill(l == 0, 1.0)\n"
            "    return out, computed\n"),
    mutants=(
        Mutant("diagonal_tile_skipped", Pitfall.DIAGONAL_TILE_SKIPPED, N_("the diagonal tile is skipped"),
               N_("your key loop stops before Tk - Tq + q0: the tile on the diagonal, where each query's own key lies, is never "
                  "computed, so the first rows see nothing."),
               N_("skip only key blocks starting at or after Tk - Tq + q1; mask inside the diagonal tile"),
               edits=(("range(0, offset + q1, block_k)", "range(0, offset + q0, block_k)"),)),
        Mutant("diagonal_unmasked", Pitfall.CAUSAL_OFF_BY_ONE, N_("the diagonal tile is not masked"),
               N_("your tiles are computed without the causal mask: inside the diagonal tile each query also sees the keys after "
                  "its own position."), END_ALIGNED,
               edits=((_UPDATE, "m, l, acc = online_softmax_update(m, l, acc, s, v[..., k0:k1, :])"),)),
        Mutant("start_aligned", Pitfall.CAUSAL_OFF_BY_ONE, N_("causal_tiled_forward's mask is START-aligned"),
               N_("your query i sits at position i, not Tk - Tq + i: with Tk > Tq each query loses the last Tk - Tq keys it may see."),
               END_ALIGNED, edits=(("q_pos = torch.arange(q0, q1, device=q.device)[:, None] + offset",
                                    "q_pos = torch.arange(q0, q1, device=q.device)[:, None]"),)),
        Mutant("own_key_blocked", Pitfall.CAUSAL_OFF_BY_ONE, N_("causal_tiled_forward's mask blocks each query's own key"),
               N_("your mask is key position < query position: one diagonal too low, so each query misses its own key and the first "
                  "sees nothing."), END_ALIGNED, edits=((_ALLOWED, _ALLOWED.replace("<= q_pos", "< q_pos")),)),
        Mutant("all_tiles", Pitfall.GENERAL, N_("causal_tiled_forward computes the future tiles too"),
               N_("your output is right but every key tile is computed, {total} per run: the tiles wholly in the future hold no "
                  "visible key and are skipped."),
               N_("loop over key blocks up to Tk - Tq + q1 only: range(0, Tk - Tq + q1, block_k)"),
               facts=lambda value, inputs: {"total": value["square"]["computed"]},
               edits=(("range(0, offset + q1, block_k)", "range(0, t_k, block_k)"),)),
        Mutant("counts_query_blocks", Pitfall.GENERAL, N_("causal_tiled_forward counts query blocks, not tiles"),
               N_("your count goes up once per query block: it must count every (query block, key block) tile computed."),
               N_("add one per tile, inside the key loop"),
               edits=(("            computed += 1\n", ""),
                      ("        out[..., q0:q1, :] = acc / l.masked_fill(l == 0, 1.0)",
                       "        computed += 1\n        out[..., q0:q1, :] = acc / l.masked_fill(l == 0, 1.0)"))),
    ),
    correct=(Correct("ceil_blocks", edits=(("range(0, offset + q1, block_k)",
                                            "range(0, block_k * -(-(offset + q1) // block_k), block_k)"),)),
             Correct("where_mask", edits=((_UPDATE, 'm, l, acc = online_softmax_update(m, l, acc, torch.where(allowed, s, '
                                                    'torch.tensor(float("-inf"))), v[..., k0:k1, :])'),))),
)

FAMILIES = (UPDATE, TILED, MEMORY, CAUSAL)
