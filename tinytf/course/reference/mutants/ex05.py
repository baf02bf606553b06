"""Exercise 5's mutants: attention with Tq != Tk, cross-attention, the encoder-decoder probe (see :mod:`.`)."""

from __future__ import annotations

from typing import Any

import torch

from tinytf.checks import Pitfall

from ....translation import N_
from . import Correct, Family, Mutant

MASK_BEFORE = N_("masked_fill(~mask, -inf) before softmax: scores.masked_fill(~mask, float('-inf')), then softmax(dim=-1)")

ATTENTION = Family(
    task="ex05_attention", cell="ex05_attention_code", subject="attention",
    source=("def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:\n"
            "    scale = 1.0 / math.sqrt(q.size(-1))\n"
            "    scores = (q @ k.transpose(-2, -1)) * scale\n"
            "    if mask is not None:\n"
            "        scores = scores.masked_fill(~mask, float(\"-inf\"))\n"
            "    weights = scores.softmax(dim=-1)\n"
            "    return weights @ v\n"),
    mutants=(
        Mutant("after_softmax", Pitfall.MASK, N_("attention applies the mask after the softmax"),
               N_("with a mask your output is (softmax(scores) * mask) @ v: the padded keys are zeroed after the softmax, so each "
                  "row's weights sum to less than one."), MASK_BEFORE,
               edits=(('scores = scores.masked_fill(~mask, float("-inf"))', "pass"),
                      ("weights = scores.softmax(dim=-1)",
                       "weights = scores.softmax(dim=-1) if mask is None else scores.softmax(dim=-1) * mask"))),
        Mutant("ignored", Pitfall.MASK, N_("attention ignores the mask"),
               N_("with a mask your output equals the output without it: the padded keys still get weight."), MASK_BEFORE,
               edits=(('scores = scores.masked_fill(~mask, float("-inf"))', "pass"),)),
        Mutant("inverted", Pitfall.MASK, N_("attention inverts the mask"),
               N_("with a mask your output attends to the padded keys only: the scores are filled with -inf where mask is True."),
               N_("block where mask is False: scores.masked_fill(~mask, float('-inf')) (True = may attend)"),
               edits=(("masked_fill(~mask,", "masked_fill(mask,"),)),
        Mutant("unscaled", Pitfall.SCALE, N_("attention does not scale the scores"),
               N_("your output is softmax(q kᵀ) v: the scores are not multiplied by 1/sqrt(d)."),
               N_("scale the scores by 1 / math.sqrt(q.size(-1))"), edits=(("scale = 1.0 / math.sqrt(q.size(-1))", "scale = 1.0"),)),
        Mutant("by_d", Pitfall.SCALE, N_("attention divides the scores by d"),
               N_("your output is softmax(q kᵀ / d) v with d = {d}: the scale is 1/sqrt(d), not 1/d."),
               N_("scale by 1 / math.sqrt(q.size(-1)), not 1 / q.size(-1)"),
               facts=lambda value, inputs: {"d": inputs["q"].size(-1)}, edits=(("1.0 / math.sqrt(q.size(-1))", "1.0 / q.size(-1)"),)),
        Mutant("over_queries", Pitfall.ORIENTATION, N_("attention normalises over the queries"),
               N_("your weights are the softmax over dim -2, the queries (Tq = {tq}): they must sum to one over the keys."),
               N_("softmax over the keys, the last axis: softmax(dim=-1)"),
               facts=lambda value, inputs: {"tq": inputs["q"].size(-2)}, edits=(("softmax(dim=-1)", "softmax(dim=-2)"),)),
    ),
    correct=(Correct("einsum", edits=(("scores = (q @ k.transpose(-2, -1)) * scale",
                                       'scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale'),)),
             Correct("finfo_min", edits=(('float("-inf")', "torch.finfo(scores.dtype).min"),))),
)

_MERGE = "out = out.transpose(1, 2).reshape(b, t_q, self.dim)"

CROSS = Family(
    task="ex05_cross", cell="ex05_cross_code", subject="CrossAttention",
    source=("class CrossAttention(nn.Module):\n"
            "    def __init__(self, dim: int, heads: int) -> None:\n"
            "        super().__init__()\n"
            "        if dim % heads != 0:\n"
            "            raise ValueError(f\"dim={dim} must be divisible by heads={heads}\")\n"
            "        self.dim, self.heads, self.head_dim = dim, heads, dim // heads\n"
            "        self.q_proj = nn.Linear(dim, dim)\n"
            "        self.k_proj = nn.Linear(dim, dim)\n"
            "        self.v_proj = nn.Linear(dim, dim)\n"
            "        self.out_proj = nn.Linear(dim, dim)\n"
            "\n"
            "    def forward(self, x: torch.Tensor, context: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:\n"
            "        b, t_q, _ = x.shape\n"
            "        t_k = context.size(1)\n"
            "        q = self.q_proj(x).view(b, t_q, self.heads, self.head_dim).transpose(1, 2)\n"
            "        k = self.k_proj(context).view(b, t_k, self.heads, self.head_dim).transpose(1, 2)\n"
            "        v = self.v_proj(context).view(b, t_k, self.heads, self.head_dim).transpose(1, 2)\n"
            "        out = attention(q, k, v, mask)\n"
            "        out = out.transpose(1, 2).reshape(b, t_q, self.dim)\n"
            "        return self.out_proj(out)\n"),
    mutants=(
        Mutant("view_merge", Pitfall.VIEW_AFTER_TRANSPOSE, N_("CrossAttention calls view on a transposed tensor"),
               N_("merging the heads with out.transpose(1, 2).view(B, Tq, D) raises: a transposed tensor is not contiguous, "
                  "so view cannot regroup its memory."),
               N_("transpose back, then reshape: out.transpose(1, 2).reshape(B, Tq, D)"),
               edits=((_MERGE, "out = out.transpose(1, 2).view(b, t_q, self.dim)"),)),
        Mutant("merge_no_transpose", Pitfall.VIEW_AFTER_TRANSPOSE, N_("CrossAttention merges the heads without transposing back"),
               N_("your output comes from out.reshape(B, Tq, D) of the [B, H, Tq, d] heads: each output row mixes one head's "
                  "several positions instead of one position's several heads."),
               N_("transpose back, then reshape: out.transpose(1, 2).reshape(B, Tq, D)"),
               edits=((_MERGE, "out = out.reshape(b, t_q, self.dim)"),)),
        Mutant("no_out_proj", Pitfall.GENERAL, N_("CrossAttention skips the output projection"),
               N_("your output is the merged heads themselves: out_proj is never applied."),
               N_("return self.out_proj(out)"), edits=(("return self.out_proj(out)", "return out"),)),
        Mutant("queries_from_context", Pitfall.ORIENTATION, N_("CrossAttention takes the queries from context"),
               N_("your output has one row per context token (Tk = {tk}), not per decoder token (Tq = {tq}): q was projected "
                  "from context."),
               N_("project the queries from x: q = self.q_proj(x), split with Tq = x.size(1)"),
               facts=lambda value, inputs: {"tk": inputs["context"].size(1), "tq": inputs["x"].size(1)},
               edits=(("q = self.q_proj(x).view(b, t_q,", "q = self.q_proj(context).view(b, t_k,"),
                      ("reshape(b, t_q, self.dim)", "reshape(b, t_k, self.dim)"))),
        Mutant("mask_dropped", Pitfall.MASK, N_("CrossAttention ignores or misuses the mask"),
               N_("with a padding mask your output equals the output without it: the mask is not passed to attention."),
               N_("pass mask on, unchanged, to attention(q, k, v, mask)"),
               edits=(("out = attention(q, k, v, mask)", "out = attention(q, k, v)"),)),
        Mutant("values_from_k_proj", Pitfall.GENERAL, N_("CrossAttention projects the values with k_proj"),
               N_("your values are k_proj(context): the keys' projection, so v_proj's weights change nothing."),
               N_("project the values with v_proj: v = self.v_proj(context)"),
               edits=(("v = self.v_proj(context)", "v = self.k_proj(context)"),)),
    ),
    correct=(Correct("permute_flatten", edits=((_MERGE, "out = out.permute(0, 2, 1, 3).flatten(2)"),)),
             Correct("unflatten_split", edits=(("q = self.q_proj(x).view(b, t_q, self.heads, self.head_dim).transpose(1, 2)",
                                                "q = self.q_proj(x).unflatten(-1, (self.heads, self.head_dim)).permute(0, 2, 1, 3)"),))),
)


def _encdec_signature(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    """The task's probe, with which of its inputs the student's probe changed counted as part of the result."""
    from ..ex05 import PROBES, changed_inputs

    value, inputs = PROBES["ex05_encdec"](ns, gen)
    given = {name: inputs[name] for name in ("src", "tgt", "lengths")}
    return {"value": value, "changed": changed_inputs(given, inputs["after"])}, inputs


ENCDEC = Family(
    task="ex05_encdec", cell="ex05_probe_code", subject="probe_encoder_decoder",
    source=("def probe_encoder_decoder(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor, lengths: torch.Tensor) "
            "-> dict[str, float]:\n"
            "    real = torch.arange(src.size(1), device=src.device)[None, :] < lengths.to(src.device)[:, None]\n"
            "    with torch.no_grad():\n"
            "        base = model(src, tgt, lengths)\n"
            "        changed_real = torch.where(real[..., None], torch.randn_like(src), src)\n"
            "        changed_pad = torch.where(real[..., None], src, torch.randn_like(src))\n"
            "        effect = (model(changed_real, tgt, lengths) - base).abs().max()\n"
            "        leak = (model(changed_pad, tgt, lengths) - base).abs().max()\n"
            "    return {\"encoder_effect\": float(effect), \"padding_leak\": float(leak)}\n"),
    mutants=(
        Mutant("padding_in_place", Pitfall.GENERAL, N_("probe_encoder_decoder changes its input src"),
               N_("your probe writes the random padding into the caller's src (src[~real] = …): after the call src no longer "
                  "holds the values passed in, so a second probe of the same src measures the edited input."),
               N_("clone the input before changing it: src2 = src.clone(), then edit src2"),
               edits=(("changed_pad = torch.where(real[..., None], src, torch.randn_like(src))",
                       "src[~real] = torch.randn_like(src[~real])\n        changed_pad = src"),)),
        Mutant("inverted_positions", Pitfall.GENERAL, N_("probe_encoder_decoder swaps the real and the padded positions"),
               N_("your probe's 'real' positions are t >= lengths[b], the padding: encoder_effect measures the padding and "
                  "padding_leak the real tokens, so a correct model shows a leak."),
               N_("the real positions are t < lengths[b]: real = arange(Tk)[None, :] < lengths[:, None]"),
               edits=(("[None, :] < lengths.to(src.device)[:, None]", "[None, :] >= lengths.to(src.device)[:, None]"),)),
        Mutant("whole_src", Pitfall.GENERAL, N_("the probe reports a leak on a correct model"),
               N_("your padding_leak run replaces every encoder position, real ones included: a correct model's output changes."),
               N_("change only the PADDED positions (t >= lengths[b]) of a clone of src; keep the real ones exactly as they are"),
               edits=(("changed_pad = torch.where(real[..., None], src, torch.randn_like(src))", "changed_pad = torch.randn_like(src)"),)),
        Mutant("tensor_values", Pitfall.GENERAL, N_("probe_encoder_decoder returns tensors, not numbers"),
               N_("your probe returns one-element tensors; encoder_effect and padding_leak must be Python floats."),
               N_("convert each with float(...)"),
               edits=(('return {"encoder_effect": float(effect), "padding_leak": float(leak)}',
                       'return {"encoder_effect": effect, "padding_leak": leak}'),)),
        Mutant("key_names", Pitfall.GENERAL, N_("probe_encoder_decoder returns other keys"),
               N_("your probe's result has keys other than 'encoder_effect' and 'padding_leak'."),
               N_("return {'encoder_effect': float, 'padding_leak': float}"),
               edits=(('"padding_leak": float(leak)', '"leak": float(leak)'),)),
    ),
    correct=(Correct("clone_and_fill", edits=(("changed_pad = torch.where(real[..., None], src, torch.randn_like(src))",
                                               "changed_pad = src.clone()\n        changed_pad[~real] = torch.randn_like(src)[~real]"),)),
             Correct("masked_blend", edits=(("changed_real = torch.where(real[..., None], torch.randn_like(src), src)",
                                             "noise = torch.randn_like(src)\n"
                                             "        changed_real = src * ~real[..., None] + noise * real[..., None]"),))),
    signature=_encdec_signature,
)

FAMILIES = (ATTENTION, CROSS, ENCDEC)
