"""Exercise 5 — cross-attention (Tq != Tk) and an encoder–decoder test: judges and the self-check.

Student code: ``attention(q, k, v, mask=None)``, ``CrossAttention(dim, heads)`` with ``q_proj``,
``k_proj``, ``v_proj``, ``out_proj`` and ``forward(x, context, mask=None)``, and
``probe_encoder_decoder(model, src, tgt, lengths) -> {"encoder_effect", "padding_leak"}``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..judges import judge
from . import call_student, check_parts

__all__ = ["reference_cross", "diagnose"]


def reference_cross(x: torch.Tensor, context: torch.Tensor, mask: torch.Tensor | None, heads: int,
                    qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, proj_weight: torch.Tensor,
                    proj_bias: torch.Tensor) -> torch.Tensor:
    """tinytf.MultiHeadAttention(x [B, Tq, D], context [B, Tk, D], mask) with the given weights -> [B, Tq, D]."""
    from tinytf import MultiHeadAttention

    mha = MultiHeadAttention(x.size(-1), int(heads))
    mha.load_state_dict({"qkv.weight": qkv_weight, "qkv.bias": qkv_bias, "proj.weight": proj_weight, "proj.bias": proj_bias})
    with torch.no_grad():
        return mha(x.float(), context=context.float(), mask=mask)


def _tensor(value: Any, shape: tuple[int, ...], what: str) -> torch.Tensor:
    assert isinstance(value, torch.Tensor), f"{what} must be a tensor, got {type(value).__name__}"
    assert tuple(value.shape) == tuple(shape), f"{what} has shape {list(value.shape)}, expected {list(shape)}"
    assert value.is_floating_point() and bool(torch.isfinite(value).all()), f"{what} must be finite floats"
    return value.float()


def _number(value: Any, what: str) -> float:
    assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{what} must be a number, got {type(value).__name__}"
    assert math.isfinite(value) and value >= 0, f"{what} must be a finite non-negative number, got {value}"
    return float(value)


# ---- judges ---------------------------------------------------------------------------------------


@judge("ex05_attention")
def _judge_attention(value: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> None:
    from tinytf import scaled_dot_product_attention

    assert isinstance(value, dict) and {"plain", "masked"} <= set(value), "the record must hold 'plain' and 'masked'"
    assert q.size(-2) != k.size(-2), "the hidden test must use Tq != Tk"
    for key, m in (("plain", None), ("masked", mask)):
        expected = scaled_dot_product_attention(q.float(), k.float(), v.float(), m)
        got = _tensor(value[key], tuple(expected.shape), f"attention ({key})")
        assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4), f"attention ({key}) differs from the reference"


@judge("ex05_cross")
def _judge_cross(value: Any, x: torch.Tensor, context: torch.Tensor, mask: torch.Tensor, heads: int,
                 qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor) -> None:
    assert isinstance(value, dict) and {"plain", "masked"} <= set(value), "the record must hold 'plain' and 'masked'"
    for key, m in (("plain", None), ("masked", mask)):
        expected = reference_cross(x, context, m, heads, qkv_weight, qkv_bias, proj_weight, proj_bias)
        got = _tensor(value[key], tuple(expected.shape), f"CrossAttention ({key})")
        assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4), f"CrossAttention ({key}) differs from tinytf.MultiHeadAttention"


@judge("ex05_encdec")
def _judge_encdec(value: Any, src: torch.Tensor, tgt: torch.Tensor, lengths: torch.Tensor, dim: int, heads: int) -> None:
    assert isinstance(value, dict) and {"good", "leaky"} <= set(value), "the record must hold the probes of both models"
    assert bool((lengths < src.size(1)).all()), "every hidden sequence is padded"
    for which in ("good", "leaky"):
        probe = value[which]
        assert isinstance(probe, dict) and {"encoder_effect", "padding_leak"} <= set(probe), \
            f"probe_encoder_decoder must return encoder_effect and padding_leak ({which} model)"
    good, leaky = value["good"], value["leaky"]
    assert _number(good["encoder_effect"], "encoder_effect") > 1e-4, "the probe found no encoder effect on a correct model"
    assert _number(good["padding_leak"], "padding_leak") < 1e-5, "the probe reported a padding leak on a correct model"
    assert _number(leaky["padding_leak"], "padding_leak") > 1e-4, "the probe missed the leak of a model that ignores padding"
    assert _number(leaky["encoder_effect"], "encoder_effect") > 1e-4, "the probe found no encoder effect on the leaky model"


# ---- self-check diagnosis -------------------------------------------------------------------------


_call = call_student  # shared: tinytf.course.reference.call_student


def _diagnose_cross(cls: Any, attention_ok: bool) -> list[Any]:
    from tinytf import MultiHeadAttention, padding_mask
    from tinytf.checks import Finding

    torch.manual_seed(5)  # the module's own initialisation is overwritten below
    mha = MultiHeadAttention(12, 3)
    cross, problem = _call("CrossAttention(12, 3)", cls, 12, 3)
    if problem:
        return [problem]
    names = ("q_proj", "k_proj", "v_proj", "out_proj")
    if not all(isinstance(getattr(cross, n, None), torch.nn.Linear) for n in names):
        return [Finding(0, "CrossAttention lost its layers", f"keep the given __init__: it defines {', '.join(names)}.")]
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
        out, problem = _call("CrossAttention.forward", cross, x, ctx)
        if problem:
            shapes = "shape" in problem.message or "size" in problem.message
            hint = " Take Tq from x and Tk from context: they differ in cross-attention." if shapes else ""
            return [Finding(problem.pitfall, problem.title, problem.message + hint)]
        expected = mha(x, context=ctx)
        if not isinstance(out, torch.Tensor) or out.shape != expected.shape:
            got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            return [Finding(2, "CrossAttention returns the wrong shape", f"expected [B, Tq, D] = {list(expected.shape)}, got {got}.")]
        if not torch.allclose(out, expected, atol=1e-4):
            msg = "with the weights of tinytf.MultiHeadAttention the outputs differ."
            if not attention_ok:
                msg += " Fix attention() first: CrossAttention uses it."
            else:
                msg += (" Check: q from x, k and v from context; split heads with view(B, T, H, d).transpose(1, 2); "
                        "merge with transpose(1, 2).reshape(B, Tq, D); then out_proj.")
            return [Finding(0, "CrossAttention differs from the reference", msg)]
        masked, problem = _call("CrossAttention.forward with a padding mask", cross, x, ctx, pad)
        if problem:
            return [problem]
        if not torch.allclose(masked, mha(x, context=ctx, mask=pad), atol=1e-4):
            return [Finding(3, "CrossAttention ignores or misuses the mask", "pass mask on to attention(q, k, v, mask).")]
    return []


def _diagnose_probe(fn: Any, namespace: dict[str, Any]) -> list[Any]:
    from tinytf.checks import Finding

    model_cls = namespace.get("TinyEncoderDecoder")
    if model_cls is None:
        return [Finding(0, "TinyEncoderDecoder is missing", "keep the given model cell (run it before the probe).")]
    torch.manual_seed(7)
    good = model_cls(12, 3).eval()
    leaky = model_cls(12, 3, leaky=True).eval()
    leaky.load_state_dict(good.state_dict())
    g = torch.Generator().manual_seed(8)
    src, tgt, lengths = torch.randn(3, 6, 12, generator=g), torch.randn(3, 4, 12, generator=g), torch.tensor([3, 5, 2])
    p_good, problem = _call("probe_encoder_decoder", fn, good, src, tgt, lengths)
    if problem:
        return [problem]
    if not isinstance(p_good, dict) or not {"encoder_effect", "padding_leak"} <= set(p_good):
        return [Finding(0, "probe_encoder_decoder returns the wrong thing", "return {'encoder_effect': float, 'padding_leak': float}.")]
    p_leaky, problem = _call("probe_encoder_decoder", fn, leaky, src, tgt, lengths)
    if problem:
        return [problem]
    findings = []
    try:
        effect, leak_good, leak_bad = float(p_good["encoder_effect"]), float(p_good["padding_leak"]), float(p_leaky["padding_leak"])
    except (TypeError, ValueError, KeyError):
        return [Finding(0, "probe_encoder_decoder returns non-numbers", "both entries must be floats (use float(...)).")]
    if not effect > 1e-4:
        findings.append(Finding(0, "the probe sees no encoder effect",
                                "replace the REAL encoder positions (t < lengths[b]) of src by new random values and compare the outputs."))
    if not leak_good < 1e-5:
        findings.append(Finding(3, "the probe reports a leak on a correct model",
                                "change only the PADDED positions (t >= lengths[b]); keep the real ones exactly as they are."))
    if not leak_bad > 1e-4:
        findings.append(Finding(3, "the probe misses a model that ignores padding",
                                "padding_leak must measure the change when only padded encoder positions change: max |out - out_changed|."))
    return findings


def diagnose(namespace: dict[str, Any]) -> list[Any]:
    """Findings about the student's ex05 code in ``namespace`` (empty when all looks right); never raises."""
    from tinytf.checks import Finding, diagnose_attention

    findings: list[Any] = []
    attention_ok = False
    fn = namespace.get("attention")
    if not callable(fn):
        findings.append(Finding(0, "attention is missing", "Define attention(q, k, v, mask=None) in the notebook."))
    else:
        try:
            found = diagnose_attention(fn)
        except Exception as err:  # noqa: BLE001 - the diagnosis must never crash the notebook
            found = [Finding(0, "attention could not be checked", f"{type(err).__name__}: {err}")]
        if any("NotImplementedError" in f.message for f in found):
            found = [Finding(0, "attention is not implemented yet",
                             "attention still raises NotImplementedError: replace that line with your code.")]
        findings.extend(found)
        attention_ok = not found
    findings.extend(check_parts(namespace, [("CrossAttention", lambda obj: _diagnose_cross(obj, attention_ok)),
                                            ("probe_encoder_decoder", lambda obj: _diagnose_probe(obj, namespace))]))
    return findings
