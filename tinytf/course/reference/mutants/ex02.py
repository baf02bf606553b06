"""Exercise 2's mutants: the padding mask, the masked softmax, renormalising, padded attention (see :mod:`.`)."""

from __future__ import annotations

from typing import Any

from tinytf.checks import Pitfall

from ....translation import N_
from . import Correct, Family, Mutant


def _lengths(value: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    return {"lengths": list(inputs["lengths"]), "t": inputs["t"]}


MASK = Family(
    task="ex02_mask", cell="ex02_mask_answer", subject="build_padding_mask",
    source=("def build_padding_mask(lengths: list[int] | torch.Tensor, t: int, device: torch.device | str | None = None) -> torch.Tensor:\n"
            "    lengths = torch.as_tensor(lengths, device=device)\n"
            "    pos = torch.arange(t, device=lengths.device)\n"
            "    keep = pos[None, :] < lengths[:, None]\n"
            "    return keep[:, None, None, :]\n"),
    mutants=(
        Mutant("inverted", Pitfall.MASK, N_("build_padding_mask uses the inverted convention"),
               N_("your mask is True on the padding and False on the real tokens (lengths {lengths}, t = {t}): the opposite of "
                  "True = may attend."),
               N_("flip the comparison: positions < lengths (True = real token), not positions >= lengths"), facts=_lengths,
               edits=(("pos[None, :] < lengths[:, None]", "pos[None, :] >= lengths[:, None]"),)),
        Mutant("one_more", Pitfall.GENERAL, N_("build_padding_mask marks one key too many"),
               N_("your mask also marks key lengths[b], the first padding position, as real (lengths {lengths}, t = {t}): "
                  "positions <= lengths."),
               N_("compare with <: key j is real when j < lengths[b]"), facts=_lengths,
               edits=(("pos[None, :] < lengths[:, None]", "pos[None, :] <= lengths[:, None]"),)),
        Mutant("one_less", Pitfall.GENERAL, N_("build_padding_mask marks one key too few"),
               N_("your mask marks each sequence's last real token as padding (lengths {lengths}, t = {t}): positions < lengths - 1."),
               N_("compare positions < lengths[b], not lengths[b] - 1"), facts=_lengths,
               edits=(("pos[None, :] < lengths[:, None]", "pos[None, :] < lengths[:, None] - 1"),)),
        Mutant("flat", Pitfall.GENERAL, N_("build_padding_mask returns a [B, t] mask"),
               N_("your mask is [B, t] = [{b}, {t}]: on scores [B, H, Tq, Tk] a [B, t] mask would be read as [Tq, Tk]."),
               N_("return the [B, t] comparison with the head and query axes added: mask[:, None, None, :]"),
               facts=lambda value, inputs: {"b": len(inputs["lengths"]), "t": inputs["t"]},
               edits=(("return keep[:, None, None, :]", "return keep"),)),
        Mutant("query_axis", Pitfall.ORIENTATION, N_("build_padding_mask masks queries, not keys"),
               N_("your mask is [B, 1, t, 1]: it marks query rows; a padding mask blocks keys, the last axis [B, 1, 1, t]."),
               N_("put the positions on the last axis: keep[:, None, None, :]"),
               edits=(("return keep[:, None, None, :]", "return keep[:, None, :, None]"),)),
        Mutant("left_padded", Pitfall.GENERAL, N_("build_padding_mask pads on the left"),
               N_("your mask marks the LAST lengths[b] positions as real (lengths {lengths}, t = {t}); the sequences are padded on "
                  "the right, so the FIRST lengths[b] positions are the real ones."),
               N_("mark the first lengths[b] positions: positions < lengths[b]"), facts=_lengths,
               edits=(("pos[None, :] < lengths[:, None]", "pos[None, :] >= t - lengths[:, None]"),)),
        Mutant("float_mask", Pitfall.GENERAL, N_("build_padding_mask returns 0/1 numbers, not bools"),
               N_("your mask holds floating-point 0 and 1; masked_fill and ~mask need a torch.bool mask (True = may attend)."),
               N_("return the comparison itself, which is torch.bool: no .float()"),
               edits=(("return keep[:, None, None, :]", "return keep[:, None, None, :].float()"),)),
    ),
    correct=(Correct("view", edits=(("return keep[:, None, None, :]", "return keep.view(keep.size(0), 1, 1, t)"),)),
             Correct("index_lists", edits=(("keep = pos[None, :] < lengths[:, None]",
                                            "keep = torch.tensor([[j < n for j in range(t)] for n in lengths.tolist()], "
                                            "device=lengths.device)"),))),
)

MASKED_SOFTMAX = Family(
    task="ex02_masked_softmax", cell="ex02_softmax_answer", subject="masked_softmax",
    source=("def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:\n"
            "    blocked = scores.masked_fill(~mask, float(\"-inf\"))\n"
            "    return blocked.softmax(dim=-1)\n"),
    mutants=(
        Mutant("inverted", Pitfall.MASK, N_("masked_softmax uses the inverted mask"),
               N_("your weights sit on the blocked keys: the scores are filled with -inf where mask is True (may attend)."),
               N_("block where mask is False: scores.masked_fill(~mask, float('-inf'))"),
               edits=(("masked_fill(~mask,", "masked_fill(mask,"),)),
        Mutant("after_softmax", Pitfall.MASK, N_("masked_softmax applies the mask after the softmax"),
               N_("your weights are softmax(scores) * mask: the blocked weights are zeroed after the softmax, so the rows no longer "
                  "sum to one (they sum to the weight left on the allowed keys)."),
               N_("masked_fill(~mask, -inf) before softmax: scores.masked_fill(~mask, float('-inf')).softmax(dim=-1)"),
               edits=(('blocked = scores.masked_fill(~mask, float("-inf"))', "blocked = scores"),
                      ("return blocked.softmax(dim=-1)", "return blocked.softmax(dim=-1) * mask"))),
        Mutant("fill_zero", Pitfall.MASK, N_("masked_softmax fills the blocked scores with 0"),
               N_("your blocked scores are set to 0, not -inf: exp(0) = 1, so the blocked keys keep a weight."),
               N_("fill with float('-inf'), whose exp is exactly 0"), edits=(('float("-inf")', "0.0"),)),
        Mutant("over_queries", Pitfall.ORIENTATION, N_("masked_softmax normalises over the queries"),
               N_("your weights are the softmax over dim -2, the queries: columns sum to one, rows do not."),
               N_("softmax over the keys, the last axis: softmax(dim=-1)"), edits=(("softmax(dim=-1)", "softmax(dim=-2)"),)),
        Mutant("ignored", Pitfall.MASK, N_("masked_softmax ignores the mask"),
               N_("your weights are softmax(scores) over every key: the blocked keys get weight too."),
               N_("fill the blocked scores with -inf before the softmax: scores.masked_fill(~mask, float('-inf'))"),
               edits=(('blocked = scores.masked_fill(~mask, float("-inf"))', "blocked = scores"),)),
        Mutant("in_place", Pitfall.GENERAL, N_("masked_softmax changes its input in place"),
               N_("your weights are right, but the call writes -inf into the caller's scores tensor (masked_fill_): after it, the "
                  "scores passed in are changed."),
               N_("use masked_fill, which returns a new tensor, not masked_fill_"),
               edits=(("scores.masked_fill(", "scores.masked_fill_("),)),
    ),
    correct=(Correct("where", edits=(('blocked = scores.masked_fill(~mask, float("-inf"))',
                                      'blocked = torch.where(mask, scores, torch.tensor(float("-inf")))'),)),
             Correct("by_hand", edits=(("return blocked.softmax(dim=-1)",
                                        "e = (blocked - blocked.amax(dim=-1, keepdim=True)).exp()\n"
                                        "    return e / e.sum(dim=-1, keepdim=True)"),))),
)

RENORMALISE = Family(
    task="ex02_renormalise", cell="ex02_renorm_answer", subject="renormalise",
    source=("def renormalise(weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:\n"
            "    kept = weights * mask\n"
            "    return kept / kept.sum(dim=-1, keepdim=True)\n"),
    mutants=(
        Mutant("no_rescale", Pitfall.MASK, N_("renormalise does not rescale the rows"),
               N_("your result is weights * mask: the blocked weights are zeroed, but the rows are not divided by their new sum, so "
                  "they add up to less than one."),
               N_("divide each row by its new sum: w / w.sum(dim=-1, keepdim=True)"),
               edits=(("return kept / kept.sum(dim=-1, keepdim=True)", "return kept"),)),
        Mutant("inverted", Pitfall.MASK, N_("renormalise keeps the blocked weights"),
               N_("your result keeps the weights where mask is False and zeroes the allowed ones: weights * ~mask, renormalised."),
               N_("keep where mask is True: weights * mask"), edits=(("weights * mask", "weights * ~mask"),)),
        Mutant("global_sum", Pitfall.GENERAL, N_("renormalise divides by the sum of the whole tensor"),
               N_("your result divides by kept.sum(), every entry's sum: all rows together sum to one, each row only to its share."),
               N_("divide by each row's own sum: kept.sum(dim=-1, keepdim=True)"),
               edits=(("kept.sum(dim=-1, keepdim=True)", "kept.sum()"),)),
        Mutant("over_queries", Pitfall.ORIENTATION, N_("renormalise rescales the columns"),
               N_("your result divides by the sums over dim -2, the queries: columns sum to one, rows do not."),
               N_("sum over the keys, the last axis: kept.sum(dim=-1, keepdim=True)"), edits=(("sum(dim=-1", "sum(dim=-2"),)),
        Mutant("in_place", Pitfall.GENERAL, N_("renormalise changes its input in place"),
               N_("your result is right, but the call zeroes the caller's weights tensor in place (mul_): after it, the weights "
                  "passed in are changed."),
               N_("compute weights * mask as a new tensor; never edit an input in place"),
               edits=(("kept = weights * mask", "kept = weights.mul_(mask)"),)),
        Mutant("softmax_again", Pitfall.GENERAL, N_("renormalise applies a softmax again"),
               N_("your result is softmax(weights * mask): the weights are exponentiated a second time and the blocked ones get "
                  "exp(0) = 1 each."),
               N_("rescale by division, not by a softmax: kept / kept.sum(dim=-1, keepdim=True)"),
               edits=(("return kept / kept.sum(dim=-1, keepdim=True)", "return kept.softmax(dim=-1)"),)),
    ),
    correct=(Correct("masked_fill", edits=(("kept = weights * mask", "kept = weights.masked_fill(~mask, 0.0)"),)),
             Correct("indexed_sum", edits=(("kept / kept.sum(dim=-1, keepdim=True)", "kept / kept.sum(-1)[..., None]"),))),
)

ATTENTION = Family(
    task="ex02_attention", cell="ex02_attention_answer", subject="padded_attention",
    source=("def padded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:\n"
            "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))\n"
            "    weights = scores.softmax(dim=-1) if mask is None else masked_softmax(scores, mask)\n"
            "    return weights @ v\n"),
    mutants=(
        Mutant("ignored", Pitfall.MASK, N_("padded_attention ignores the mask"),
               N_("with a mask your output equals attention without it: the padded keys and values still count."),
               N_("pass the mask on: masked_softmax(scores, mask) when mask is not None"),
               edits=(("scores.softmax(dim=-1) if mask is None else masked_softmax(scores, mask)", "scores.softmax(dim=-1)"),)),
        Mutant("inverted", Pitfall.MASK, N_("padded_attention inverts the mask"),
               N_("with a mask your output is attention over the PADDED keys only: masked_softmax got ~mask."),
               N_("hand the mask over unchanged: masked_softmax(scores, mask) (True = may attend)"),
               edits=(("masked_softmax(scores, mask)", "masked_softmax(scores, ~mask)"),)),
        Mutant("unscaled", Pitfall.SCALE, N_("padded_attention does not scale the scores"),
               N_("your output is softmax(q kᵀ) v without the division by sqrt(d), with and without a mask."),
               N_("divide the scores by math.sqrt(q.size(-1))"), edits=((" / math.sqrt(q.size(-1))", ""),)),
        Mutant("by_d", Pitfall.SCALE, N_("padded_attention divides the scores by d"),
               N_("your output is softmax(q kᵀ / d) v: the scores are divided by d = q.size(-1) instead of sqrt(d)."),
               N_("divide by math.sqrt(q.size(-1)), not by q.size(-1)"), edits=(("math.sqrt(q.size(-1))", "q.size(-1)"),)),
        Mutant("after_softmax", Pitfall.MASK, N_("padded_attention masks after the softmax"),
               N_("with a mask your weights are softmax(scores) * mask: zeroed after the softmax, so the rows sum to less than one."),
               N_("masked_fill(~mask, -inf) before softmax: use masked_softmax(scores, mask)"),
               edits=(("else masked_softmax(scores, mask)", "else scores.softmax(dim=-1) * mask"),)),
        Mutant("out_from_k", Pitfall.GENERAL, N_("padded_attention averages the keys"),
               N_("your output is weights @ k: the keys (width {d}) are averaged instead of the values (width {dv})."),
               N_("multiply the weights by the values: weights @ v"),
               facts=lambda value, inputs: {"d": inputs["k"].size(-1), "dv": inputs["v"].size(-1)},
               edits=(("return weights @ v", "return weights @ k"),)),
    ),
    correct=(Correct("einsum", edits=(("return weights @ v", 'return torch.einsum("bhqk,bhkd->bhqd", weights, v)'),)),
             Correct("scale_q_first", edits=(("scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))",
                                              "scores = (q / math.sqrt(q.size(-1))) @ k.transpose(-2, -1)"),))),
)

FAMILIES = (MASK, MASKED_SOFTMAX, RENORMALISE, ATTENTION)
