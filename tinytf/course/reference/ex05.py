"""Exercise 5 — cross-attention (Tq != Tk) and an encoder–decoder test: judges and the self-check.

Student code: ``attention(q, k, v, mask=None)``, ``CrossAttention(dim, heads)`` with ``q_proj``,
``k_proj``, ``v_proj``, ``out_proj`` and ``forward(x, context, mask=None)``, and
``probe_encoder_decoder(model, src, tgt, lengths) -> {"encoder_effect", "padding_leak"}``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch

from tinytf.checks import Finding, Pitfall, found

from ...translation import N_, gettext
from ...translation import gettext as _
from . import Probe, call_student, check_parts, explained, flat, stub_or, swapped
from .judging import judge
from .validators import close, differs, float_inputs, has_keys, number, shape_of, shapes, tensor

__all__ = ["reference_cross", "named_findings", "diagnose", "diagnose_tasks", "PROBES", "changed_inputs"]

PROBE_KEYS = ("encoder_effect", "padding_leak")


def reference_cross(x: torch.Tensor, context: torch.Tensor, mask: torch.Tensor | None, heads: int,
                    qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, proj_weight: torch.Tensor,
                    proj_bias: torch.Tensor) -> torch.Tensor:
    """tinytf.MultiHeadAttention(x [B, Tq, D], context [B, Tk, D], mask) with the given weights -> [B, Tq, D]."""
    from tinytf import MultiHeadAttention

    mha = MultiHeadAttention(x.size(-1), int(heads))
    mha.load_state_dict({"qkv.weight": qkv_weight, "qkv.bias": qkv_bias, "proj.weight": proj_weight, "proj.bias": proj_bias})
    with torch.no_grad():
        return mha(x.float(), context=context.float(), mask=mask)


# ---- judges ---------------------------------------------------------------------------------------


@judge("ex05_attention")
def _judge_attention(value: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> None:
    from tinytf import scaled_dot_product_attention

    has_keys(value, ("plain", "masked"))
    assert q.size(-2) != k.size(-2), _("the hidden test must use Tq != Tk")
    q, k, v = float_inputs(q, k, v)
    for key, m in (("plain", None), ("masked", mask)):
        expected = scaled_dot_product_attention(q, k, v, m)
        close(tensor(value[key], expected.shape, f"attention ({key})"), expected, f"attention ({key})", atol=1e-4,
              given=shapes(q=q, k=k, v=v, mask=m), reference="tinytf.scaled_dot_product_attention")


@judge("ex05_cross")
def _judge_cross(value: Any, x: torch.Tensor, context: torch.Tensor, mask: torch.Tensor, heads: int,
                 qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor) -> None:
    has_keys(value, ("plain", "masked"))
    for key, m in (("plain", None), ("masked", mask)):
        expected = reference_cross(x, context, m, heads, qkv_weight, qkv_bias, proj_weight, proj_bias)
        close(tensor(value[key], expected.shape, f"CrossAttention ({key})"), expected, f"CrossAttention ({key})", atol=1e-4,
              reference="tinytf.MultiHeadAttention", given=shapes(x=x, context=context, mask=m, heads=int(heads)))


PROBE_INPUTS = ("src", "tgt", "lengths")
UNCHANGED_FIX = N_("clone the input before changing it")


def changed_inputs(given: dict[str, torch.Tensor], after: dict[str, Any]) -> list[str]:
    """The names of the probe's inputs (``src``, ``tgt``, ``lengths``) whose values after the calls differ from ``given``."""
    return [name for name in PROBE_INPUTS if not (isinstance(after.get(name), torch.Tensor) and after[name].shape == given[name].shape
                                                  and torch.equal(after[name].cpu(), given[name].cpu()))]


@judge("ex05_encdec")
def _judge_encdec(value: Any, src: torch.Tensor, tgt: torch.Tensor, lengths: torch.Tensor, dim: int, heads: int,
                  after: dict[str, Any]) -> None:
    """``src``, ``tgt``, ``lengths``: what the probe was given; ``after``: the same tensors after both calls."""
    has_keys(after, PROBE_INPUTS, _("the record of the probe's inputs after the calls"))
    changed = changed_inputs({"src": src, "tgt": tgt, "lengths": lengths}, after)
    assert not changed, _("probe_encoder_decoder changed its input {names}: after the calls it no longer holds the values passed in, "
                          "so the probe measures its own edit, not the model; {fix}").format(names=" and ".join(changed),
                                                                                            fix=_(UNCHANGED_FIX))
    has_keys(value, ("good", "leaky"), _("the record of the probes of both models"))
    assert bool((lengths < src.size(1)).all()), _("every hidden sequence is padded")
    good, leaky = (has_keys(value[which], PROBE_KEYS, _("probe_encoder_decoder's result ({which} model)").format(which=which))
                   for which in ("good", "leaky"))
    assert number(good["encoder_effect"], "encoder_effect") > 1e-4, _("the probe found no encoder effect on a correct model")
    assert number(good["padding_leak"], "padding_leak") < 1e-5, _("the probe reported a padding leak on a correct model")
    assert number(leaky["padding_leak"], "padding_leak") > 1e-4, _("the probe missed the leak of a model that ignores padding")
    assert number(leaky["encoder_effect"], "encoder_effect") > 1e-4, _("the probe found no encoder effect on the leaky model")


# ---- self-check diagnosis -------------------------------------------------------------------------


def _diagnose_cross(cls: Any) -> list[Finding]:
    from tinytf import MultiHeadAttention, padding_mask

    torch.manual_seed(5)  # the module's own initialisation is overwritten below
    mha = MultiHeadAttention(12, 3)
    cross, problem = call_student("CrossAttention(12, 3)", cls, 12, 3)
    if problem:
        return [problem]
    names = ("q_proj", "k_proj", "v_proj", "out_proj")
    if not all(isinstance(getattr(cross, n, None), torch.nn.Linear) for n in names):
        return [found(Pitfall.GENERAL, _("CrossAttention lost its layers"),
                      _("CrossAttention(12, 3) has no nn.Linear {names}.").format(names=", ".join(names)),
                      fix=_("keep the given __init__: it defines {value_join}").format(value_join=", ".join(names)))]
    w = mha.qkv.weight.detach().chunk(3)
    bias = mha.qkv.bias.detach().chunk(3)
    with torch.no_grad():
        for layer, ww, bb in zip((cross.q_proj, cross.k_proj, cross.v_proj, cross.out_proj), (*w, mha.proj.weight), (*bias, mha.proj.bias)):
            layer.weight.copy_(ww)
            layer.bias.copy_(bb)
    g = torch.Generator().manual_seed(6)
    x, ctx = torch.randn(2, 3, 12, generator=g), torch.randn(2, 5, 12, generator=g)
    pad = padding_mask([5, 2], 5)
    with torch.no_grad():
        out, problem = call_student("CrossAttention.forward", cross, x, ctx)
        if problem:
            return [_explain_crash(cross, x, problem)]
        expected = mha(x, context=ctx)
        if not isinstance(out, torch.Tensor) or out.shape != expected.shape:
            return [found(Pitfall.ORIENTATION, _("CrossAttention returns the wrong shape"),
                          _("for x [2, 3, 12] and context [2, 5, 12] expected [B, Tq, D] = {expected_shape}, got {out}.").format(
                              expected_shape=list(expected.shape), out=shape_of(out)),
                          fix=_("merge the heads with out.transpose(1, 2).reshape(B, Tq, D), then out_proj"))]
        if not torch.allclose(out, expected, atol=1e-4):
            return [_explain_difference(cross, x, ctx, out, expected)]
        masked, problem = call_student(_("CrossAttention.forward with a padding mask"), cross, x, ctx, pad)
        if problem:
            return [problem]
        if not torch.allclose(masked, mha(x, context=ctx, mask=pad), atol=1e-4):
            return [found(Pitfall.MASK, _("CrossAttention ignores or misuses the mask"),
                          _("with a padding mask [2, 1, 1, 5] it differs from tinytf.MultiHeadAttention(x, context, mask)."),
                          fix=_("pass mask on, unchanged, to attention(q, k, v, mask)"))]
    return []


def _explain_difference(cross: Any, x: torch.Tensor, ctx: torch.Tensor, out: torch.Tensor, expected: torch.Tensor) -> Finding:
    """Name what differs when CrossAttention runs but disagrees with tinytf.MultiHeadAttention."""
    return found(Pitfall.GENERAL, _("CrossAttention differs from the reference"),
                 differs(_("CrossAttention(x, context) with the weights of tinytf.MultiHeadAttention"), out, expected,
                         shapes(x=x, context=ctx)) + ".",
                 fix=_("q from x, k and v from context; split heads with view(B, T, H, d).transpose(1, 2); "
                       "merge with transpose(1, 2).reshape(B, Tq, D); then out_proj"))


def _explain_crash(cross: Any, x: torch.Tensor, problem: Finding) -> Finding:
    """Name the mistake behind a crash of CrossAttention.forward(x [2, 3, 12], context [2, 5, 12])."""
    if "view size is not compatible" in problem.message:
        return found(Pitfall.VIEW_AFTER_TRANSPOSE, gettext("CrossAttention calls view on a transposed tensor"),
                     gettext("forward(x [2, 3, 12], context [2, 5, 12]) raised: {problem_message}").format(problem_message=problem.message))
    _, same_length = call_student("CrossAttention.forward", cross, x, x)
    if same_length is None:  # works when Tq == Tk: the lengths are mixed up
        return found(Pitfall.ORIENTATION, gettext("CrossAttention mixes up Tq and Tk"),
                     gettext("forward works when context has as many tokens as x, but with x [2, 3, 12] and context [2, 5, 12] it "
                             "raised {problem_message}.").format(problem_message=problem.message),
                     fix=gettext("split q with Tq = x.size(1) and k, v with Tk = context.size(1)"))
    return problem


def _diagnose_probe(fn: Any, namespace: dict[str, Any]) -> list[Finding]:
    model_cls = namespace.get("TinyEncoderDecoder")
    if model_cls is None:
        return [found(Pitfall.GENERAL, _("TinyEncoderDecoder is missing"), _("the probe needs the model the notebook defines."),
                      fix=_("keep the given model cell and run it before the probe"))]
    torch.manual_seed(7)
    good = model_cls(12, 3).eval()
    leaky = model_cls(12, 3, leaky=True).eval()
    leaky.load_state_dict(good.state_dict())
    g = torch.Generator().manual_seed(8)
    src, tgt, lengths = torch.randn(3, 6, 12, generator=g), torch.randn(3, 4, 12, generator=g), torch.tensor([3, 5, 2])
    given = {"src": src.clone(), "tgt": tgt.clone(), "lengths": lengths.clone()}
    p_good, problem = call_student("probe_encoder_decoder", fn, good, src, tgt, lengths)
    if problem:
        return [problem]
    changed = changed_inputs(given, {"src": src, "tgt": tgt, "lengths": lengths})
    if changed:  # the model is correct: whatever the probe then reports comes from its own edit, not from a leak
        return [found(Pitfall.GENERAL, _("probe_encoder_decoder changes its input {value_join}").format(value_join=' and '.join(changed)),
                      _("after the call {value_join} no longer hold{value} the values passed in: the probe writes into the caller's "
                        "tensor, so its 'changed' and 'unchanged' runs see the same edited input and its numbers describe the edit, not "
                        "the model.").format(value_join=', '.join(changed), value='s' if len(changed) == 1 else ''),
                      fix=_("clone the input before changing it: src2 = src.clone(), then edit src2"))]
    if not isinstance(p_good, dict) or not set(PROBE_KEYS) <= set(p_good):
        return [found(Pitfall.GENERAL, _("probe_encoder_decoder returns the wrong thing"),
                      _("it returned {type}.").format(type=type(p_good).__name__),
                      fix=_("return {'encoder_effect': float, 'padding_leak': float}"))]
    p_leaky, problem = call_student("probe_encoder_decoder", fn, leaky, src, tgt, lengths)
    if problem:
        return [problem]
    findings = []
    try:
        effect, leak_good, leak_bad = float(p_good["encoder_effect"]), float(p_good["padding_leak"]), float(p_leaky["padding_leak"])
    except (TypeError, ValueError, KeyError):
        return [found(Pitfall.GENERAL, _("probe_encoder_decoder returns non-numbers"), _("both entries must be numbers."),
                      fix=_("convert each with float(...)"))]
    if not effect > 1e-4:
        findings.append(found(Pitfall.GENERAL, _("the probe sees no encoder effect"),
                              _("encoder_effect = {effect:.3g} on a correct model, which reads its encoder.").format(effect=effect),
                              fix=_("replace the REAL encoder positions (t < lengths[b]) of a clone of src by new random values and "
                                    "compare the outputs")))
    if not leak_good < 1e-5:
        findings.append(found(Pitfall.GENERAL, _("the probe reports a leak on a correct model"),
                              _("padding_leak = {leak:.3g} on a model that masks its padding: the probe changes more than the "
                                "padding.").format(leak=leak_good),
                              fix=_("change only the PADDED positions (t >= lengths[b]) of a clone of src; keep the real ones "
                                    "exactly as they are")))
    if not leak_bad > 1e-4:
        findings.append(found(Pitfall.GENERAL, _("the probe misses a model that ignores padding"),
                              _("padding_leak = {leak:.3g} on the leaky model, whose output does change with the padding.").format(
                                  leak=leak_bad),
                              fix=_("padding_leak = max |out - out_changed| when only the padded encoder positions change")))
    return findings


# ---- probes: the judges' inputs, drawn afresh on the student's machine --------------------------


def _size(gen: torch.Generator, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi, (), generator=gen))


def _probe_attention(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    from tinytf import padding_mask

    b, h, tq, d, dv = _size(gen, 1, 3), _size(gen, 1, 4), _size(gen, 2, 7), _size(gen, 3, 12), _size(gen, 2, 7)
    tk = tq + _size(gen, 1, 5)
    q, k, v = torch.randn(b, h, tq, d, generator=gen), torch.randn(b, h, tk, d, generator=gen), torch.randn(b, h, tk, dv, generator=gen)
    mask = padding_mask(torch.randint(1, tk, (b,), generator=gen), tk)
    fn = ns["attention"]
    return {"plain": fn(q, k, v), "masked": fn(q, k, v, mask)}, {"q": q, "k": k, "v": v, "mask": mask}


def _probe_cross(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    from tinytf import MultiHeadAttention, padding_mask, scaled_dot_product_attention

    heads = _size(gen, 2, 4)  # with one head a view after transpose would still work
    dim, b, tq = heads * _size(gen, 2, 6), _size(gen, 1, 3), _size(gen, 2, 6)
    tk = tq + _size(gen, 1, 4)
    mha = MultiHeadAttention(dim, heads)
    with torch.no_grad():
        for p in mha.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    x, ctx = torch.randn(b, tq, dim, generator=gen), torch.randn(b, tk, dim, generator=gen)
    mask = padding_mask(torch.randint(1, tk, (b,), generator=gen), tk)
    with swapped(ns, attention=scaled_dot_product_attention), torch.no_grad():  # part B is graded on its own
        cross = ns["load_from_tinytf"](ns["CrossAttention"](dim, heads), mha)
        value = {"plain": cross(x, ctx), "masked": cross(x, ctx, mask)}
    weights = {"qkv_weight": mha.qkv.weight.detach(), "qkv_bias": mha.qkv.bias.detach(),
               "proj_weight": mha.proj.weight.detach(), "proj_bias": mha.proj.bias.detach()}
    return value, {"x": x, "context": ctx, "mask": mask, "heads": heads, **weights}


def _probe_encdec(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    heads = _size(gen, 1, 4)
    dim, b, tq = heads * _size(gen, 2, 6), _size(gen, 2, 4), _size(gen, 1, 6)
    tk = tq + _size(gen, 2, 5)
    lengths = torch.randint(1, tk, (b,), generator=gen)
    good = ns["TinyEncoderDecoder"](dim, heads)
    with torch.no_grad():
        for p in good.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    good.eval()
    leaky = ns["TinyEncoderDecoder"](dim, heads, leaky=True).eval()
    leaky.load_state_dict(good.state_dict())
    src, tgt = torch.randn(b, tk, dim, generator=gen), torch.randn(b, tq, dim, generator=gen)
    fn = ns["probe_encoder_decoder"]
    after = {"src": src.clone(), "tgt": tgt.clone(), "lengths": lengths.clone()}  # what the probe gets (and may change)
    given = (after["src"], after["tgt"], after["lengths"])
    value = {"good": fn(good, *given), "leaky": fn(leaky, *given)}
    return value, {"src": src, "tgt": tgt, "lengths": lengths, "dim": dim, "heads": heads, "after": after}


PROBES: dict[str, Probe] = {"ex05_attention": _probe_attention, "ex05_cross": _probe_cross, "ex05_encdec": _probe_encdec}


def named_findings(namespace: dict[str, Any], parts: list[tuple[str | tuple[str, ...], str, Any]]) -> tuple[list[Finding], set[str]]:
    """``(findings, covered)``: :func:`check_parts` on each ``(names, grade_id, check)`` of ``parts``;
    ``covered`` holds the grade ids whose task already has a named finding."""
    findings: list[Finding] = []
    covered: set[str] = set()
    for names, grade_id, check in parts:
        found_here = check_parts(namespace, [(names, check)])
        findings += found_here
        if found_here:
            covered.add(grade_id)
    return findings, covered


def diagnose_tasks(namespace: dict[str, Any], only: Iterable[str] | None = None) -> dict[str, list[Finding]]:
    """``{grade_id: findings}`` about the student's ex05 code in ``namespace``: the named checks (parts B and C on tinytf's
    attention when part A's is wrong), the task's mutants (:mod:`.mutants.ex05`), then the judges on fresh inputs for
    every task without a finding. Never raises."""
    from tinytf.checks import diagnose_attention

    part_a = functools.cache(lambda: check_parts(namespace, [("attention", lambda fn: stub_or("attention", diagnose_attention(fn)))]))

    def on_own(name: str, check: Any) -> Any:
        def run() -> list[Finding]:
            mine = namespace.get("attention") if not part_a() else _reference_attention()  # part B is judged on its own
            with swapped(namespace, attention=mine):
                return check_parts(namespace, [(name, check)])
        return run

    return explained(namespace, PROBES, {"ex05_attention": part_a, "ex05_cross": on_own("CrossAttention", _diagnose_cross),
                                         "ex05_encdec": on_own("probe_encoder_decoder", lambda fn: _diagnose_probe(fn, namespace))},
                     only=only)


def diagnose(namespace: dict[str, Any]) -> list[Finding]:
    """Findings about the student's ex05 code in ``namespace`` (empty when all looks right); see :func:`diagnose_tasks`."""
    return flat(diagnose_tasks(namespace))


def _reference_attention() -> Any:
    from tinytf import scaled_dot_product_attention

    return scaled_dot_product_attention
