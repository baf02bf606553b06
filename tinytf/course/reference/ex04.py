"""Exercise 4 — pre-norm or post-norm: judges for the hidden tests and the self-check diagnosis.

Student code: ``PreNormBlock(dim, heads, max_tokens, expansion=4)`` and ``PostNormBlock`` (same
submodule names as :class:`tinytf.TransformerBlock`), ``train_curve(block_factory, *, steps, lr, seed)
-> {"loss": [...], "grad_norm": [...]}`` and the ``curves`` of the comparison.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from tinytf.checks import Finding, Pitfall, found

from ...translation import gettext as _
from . import Probe, call_student, check_parts, explained, flat, swapped, with_cause
from .judging import judge
from .validators import close, differs, has_keys, number, shapes, tensor

__all__ = ["PROBES", "reference_block_output", "reference_init", "on_reference_init", "same_curve", "diagnose", "diagnose_tasks"]


def reference_block_output(x: torch.Tensor, state: dict, dim: int, heads: int, max_tokens: int, expansion: int, norm: str) -> torch.Tensor:
    """Output ``[B, T, D]`` of ``tinytf.TransformerBlock(..., norm=norm)`` loaded with ``state``."""
    from tinytf import TransformerBlock

    block = TransformerBlock(int(dim), int(heads), int(max_tokens), int(expansion), norm=norm)
    block.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    block.eval()
    with torch.no_grad():
        return block(x.float())


def reference_init(self: torch.nn.Module, dim: int, heads: int, max_tokens: int, expansion: int = 4) -> None:
    """tinytf's ``PreNormBlock.__init__`` (Task 4a): the submodules norm1, attn, norm2, ffn of
    :class:`tinytf.TransformerBlock`. Task 4b's tests build ``PostNormBlock`` with it (it inherits
    ``__init__``), so a mistake in Task 4a costs only that task."""
    from tinytf import TransformerBlock

    torch.nn.Module.__init__(self)
    block = TransformerBlock(dim, heads, max_tokens, expansion)
    self.norm1, self.attn, self.norm2, self.ffn = block.norm1, block.attn, block.norm2, block.ffn


def on_reference_init(namespace: dict[str, Any]) -> AbstractContextManager[None]:
    """For the duration, the student's ``PreNormBlock`` (when it is a class) builds with :func:`reference_init`."""
    pre = namespace.get("PreNormBlock")
    return swapped(pre, __init__=reference_init) if isinstance(pre, type) else nullcontext()


def same_curve(a: dict, b: dict, rel_tol: float = 1e-4) -> bool:
    """Two training curves agree step by step (exactly on a CPU; GPU kernels may differ in the last bits)."""
    pairs = list(zip(a["loss"] + a["grad_norm"], b["loss"] + b["grad_norm"]))
    return len(a["loss"]) == len(b["loss"]) and all(math.isclose(x, y, rel_tol=rel_tol, abs_tol=1e-6) for x, y in pairs)


def _curve(c: Any, steps: int, what: str) -> dict[str, list[float]]:
    """A training curve ``{"loss": [...], "grad_norm": [...]}``: one finite non-negative number per step."""
    has_keys(c, ("loss", "grad_norm"), what)
    for key in ("loss", "grad_norm"):
        values = c[key]
        assert isinstance(values, list) and len(values) == int(steps), _("{what}['{key}'] must have one value per step ({steps})").format(
            what=what, key=key, steps=steps)
        for step, v in enumerate(values):
            number(v, f"{what}['{key}'][{step}]")
    return c


# ---- judges ---------------------------------------------------------------------------------------


def _judge_block(value: Any, x: torch.Tensor, state: dict, dim: int, heads: int, max_tokens: int, expansion: int, norm: str) -> None:
    expected = reference_block_output(x, state, dim, heads, max_tokens, expansion, norm)
    name = "PreNormBlock" if norm == "pre" else "PostNormBlock"
    assert isinstance(value, torch.Tensor) and tuple(value.shape) == tuple(expected.shape), (
        _("{name} must map [B, T, D] to [B, T, D]").format(name=name))
    close(tensor(value, expected.shape, name), expected, f"{name}(x)",
          reference=f"tinytf.TransformerBlock(norm='{norm}') with the same weights",
          given=shapes(x=x, dim=int(dim), heads=int(heads), expansion=int(expansion)))


@judge("ex04_pre_block")
def _judge_pre(value: Any, **inputs: Any) -> None:
    assert inputs.get("norm") == "pre", _("the pre-norm record was made for another layout")
    _judge_block(value, **inputs)


@judge("ex04_post_block")
def _judge_post(value: Any, **inputs: Any) -> None:
    assert inputs.get("norm") == "post", _("the post-norm record was made for another layout")
    _judge_block(value, **inputs)


@judge("ex04_train")
def _judge_train(value: Any, steps: int, seed: int, vocab: int, layers: int, factory_calls: int) -> None:
    has_keys(value, ("first", "second"), _("the training record"))
    first = _curve(value["first"], steps, "train_curve(...)")
    second = _curve(value["second"], steps, _("train_curve(...) repeated"))
    assert same_curve(first, second), _("train_curve is not reproducible from its seed")
    assert int(factory_calls) == 2 * int(layers), _("train_curve must build its blocks with block_factory")
    assert 0.5 * math.log(vocab) < first["loss"][0] < 2 * math.log(vocab), _("train_curve: the first loss is implausible")
    assert all(g > 0 for g in first["grad_norm"]), _("train_curve: gradient norms must be positive")


@judge("ex04_comparison")
def _judge_comparison(value: Any, steps: int, vocab: int, lrs: list) -> None:
    keys = {f"{layout}@{lr:g}" for layout in ("pre", "post") for lr in lrs}
    assert isinstance(value, dict) and set(value) == keys, _("curves must hold exactly {keys}").format(keys=sorted(keys))
    for key in sorted(keys):
        c = _curve(value[key], steps, f"curves[{key}]")
        assert 0.5 * math.log(vocab) < c["loss"][0] < 2 * math.log(vocab), _("curves[{key}]: the first loss is implausible").format(key=key)
    for lr in lrs:
        assert value[f"pre@{lr:g}"] != value[f"post@{lr:g}"], _(
            "curves: the post-norm run at lr={lr:g} repeats the pre-norm one: build PostNormBlock for 'post'").format(lr=lr)
    learned = [key for key in keys if min(value[key]["loss"]) < 0.8 * value[key]["loss"][0]]
    assert learned, _("no run made progress: check train_curve and the learning rates")


# ---- self-check diagnosis -------------------------------------------------------------------------


def _diagnose_block(name: str, cls: Any, norm: str) -> list[Finding]:
    from tinytf import TransformerBlock
    from tinytf.checks import diagnose_block

    dim, heads, tokens = 16, 4, 8
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        block, problem = call_student(name, cls, dim, heads, tokens)
        if problem:
            return [problem]
        ref = TransformerBlock(dim, heads, tokens, norm=norm)
        with torch.no_grad():  # random LayerNorm affine parameters so that every parameter matters
            for p in ref.parameters():
                p.add_(0.1 * torch.randn_like(p))
    findings = [dataclasses.replace(f, title=f"{name}: {f.title}") for f in diagnose_block(lambda: cls(dim, heads, tokens))]
    mine, want = list(block.state_dict()), list(ref.state_dict())
    if mine != want:
        missing = [k for k in want if k not in mine]
        extra = [k for k in mine if k not in want]
        findings.append(found(Pitfall.GENERAL, _("{name}: parameter names differ from tinytf.TransformerBlock").format(name=name),
                              _("missing {value}, unexpected {value2}.").format(value=missing or _("none"), value2=extra or _("none")),
                              fix=_("keep the submodules norm1, attn (tinytf.CausalSelfAttention), norm2, "
                                    "ffn (Sequential(Linear, GELU, Linear))")))
    if findings:
        return findings
    other = "post" if norm == "pre" else "pre"
    try:
        block.load_state_dict(ref.state_dict(), strict=True)
        x = torch.randn(3, tokens, dim, generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            y, want_y = block(x), ref(x)
            other_ref = TransformerBlock(dim, heads, tokens, norm=other)
            other_ref.load_state_dict(ref.state_dict())
            other_y = other_ref(x)
    except Exception as err:  # noqa: BLE001
        return [Finding(Pitfall.GENERAL, _("{name} raises when run").format(name=name), f"{type(err).__name__}: {err}")]
    if torch.allclose(y, want_y, atol=1e-5):
        return []
    layout = ("x = x + attn(norm1(x)); x = x + ffn(norm2(x))" if norm == "pre" else "x = norm1(x + attn(x)); x = norm2(x + ffn(x))")
    if torch.allclose(y, other_y, atol=1e-5):
        return [found(Pitfall.GENERAL, _("{name} computes the {other}-norm layout").format(name=name, other=other),
                      _("with tinytf's weights it matches TransformerBlock(norm='{other}').").format(other=other),
                      fix=_("{name}.forward computes {layout}").format(name=name, layout=layout))]
    named = _name_block_mistake(block, ref, x, y, name, layout)
    if named:
        return [named]
    return [found(Pitfall.GENERAL, _("{name} differs from tinytf.TransformerBlock(norm='{norm}')").format(name=name, norm=norm),
                  differs(_("{name}(x) with that block's weights").format(name=name), y, want_y, f"x {list(x.shape)}") + ".",
                  fix=_("compare the steps one by one (attn, ffn with GELU, the norms) with tinytf.TransformerBlock"))]


def _name_block_mistake(block: Any, ref: Any, x: torch.Tensor, y: torch.Tensor, name: str, layout: str) -> Finding | None:
    """A block that runs with tinytf's weights but computes something else: the activation, or the norm on the branch."""
    acts = sorted({type(m).__name__ for m in block.ffn.modules() if isinstance(m, (torch.nn.ReLU, torch.nn.SiLU, torch.nn.Tanh))})
    if acts:
        return found(Pitfall.GENERAL, _("{name}: the feed-forward net uses {act}, not GELU").format(name=name, act=acts[0]),
                     _("{name}.ffn holds {act}; tinytf.TransformerBlock's ffn is Sequential(Linear, GELU, Linear), so the "
                       "outputs differ with the same weights.").format(name=name, act=acts[0]),
                     fix=_("build the ffn with nn.GELU() instead of nn.{act}()").format(act=acts[0]))
    with torch.no_grad():
        h = x + ref.norm1(ref.attn(x))
        branch = h + ref.norm2(ref.ffn(h))
    if torch.allclose(y, branch, atol=1e-5):
        return found(Pitfall.GENERAL, _("{name} normalises the branch, not the residual sum").format(name=name),
                     _("{name}(x) = x + norm1(attn(x)), then + norm2(ffn(·)): the norms sit on the branches.").format(name=name),
                     fix=_("normalise the sum: {layout}").format(layout=layout))
    return None


def _diagnose_train(fn: Any) -> list[Finding]:
    from tinytf import TransformerBlock

    def factory() -> torch.nn.Module:
        return TransformerBlock(32, 4, 16)

    with torch.random.fork_rng(devices=[]):
        a, problem = call_student("train_curve", fn, factory, steps=2, lr=1e-3, seed=3)
        if problem:
            return [problem]
        b, problem = call_student("train_curve", fn, factory, steps=2, lr=1e-3, seed=3)
        if problem:
            return [problem]
    try:
        _curve(a, 2, "train_curve(...)")
    except AssertionError as err:
        return [found(Pitfall.GENERAL, _("train_curve returns the wrong structure"), _("{err}.").format(err=err),
                      fix=_("return {'loss': [...], 'grad_norm': [...]}, one float per step"))]
    if not same_curve(a, b):
        return [found(Pitfall.GENERAL, _("train_curve is not reproducible"), _("two runs with the same seed differ."),
                      fix=_("call torch.manual_seed(seed) before building the model, and draw the batches from "
                            "torch.Generator().manual_seed(seed)"))]
    return []


# ---- the judges on fresh inputs (the self-check's copy of the grader's verdict) ------------------


def _probe_block(cls_name: str, norm: str) -> Probe:
    def probe(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
        from tinytf import TransformerBlock

        heads = [2, 4][int(torch.randint(0, 2, (1,), generator=gen))]
        dim, tokens, expansion = (int(torch.randint(lo, hi, (1,), generator=gen)) for lo, hi in ((2, 6), (3, 9), (1, 4)))
        dim *= heads
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
            ref = TransformerBlock(dim, heads, tokens, expansion, norm=norm)
            with on_reference_init(ns) if norm == "post" else nullcontext():  # Task 4b on its own, as in its test
                block = ns[cls_name](dim, heads, tokens, expansion)
        with torch.no_grad():  # random LayerNorm affine parameters too, so that every parameter matters
            for p in ref.parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
        block.load_state_dict(ref.state_dict(), strict=True)
        x = torch.randn(2, tokens, dim, generator=gen)
        with torch.no_grad():
            y = block(x)
        return y, {"x": x, "state": dict(ref.state_dict()), "dim": dim, "heads": heads, "max_tokens": tokens, "expansion": expansion,
                   "norm": norm}
    return probe


def _probe_train(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    from tinytf import TransformerBlock

    calls = []

    def factory() -> torch.nn.Module:
        calls.append(1)
        return TransformerBlock(ns["DIM"], ns["HEADS"], ns["TOKENS"])

    steps, seed = 2, int(torch.randint(0, 10**6, (1,), generator=gen))
    with torch.random.fork_rng(devices=[]):
        first = ns["train_curve"](factory, steps=steps, lr=2e-3, seed=seed)
        second = ns["train_curve"](factory, steps=steps, lr=2e-3, seed=seed)
    return {"first": first, "second": second}, {"steps": steps, "seed": seed, "vocab": ns["VOCAB"], "layers": ns["LAYERS"],
                                                "factory_calls": len(calls)}


def _probe_comparison(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    """The notebook's own ``curves`` (the comparison is not rerun), exported as the hidden test does."""
    curves, lrs = ns["curves"], [ns["LR_HIGH"], ns["LR_LOW"]]
    value = {f"{layout}@{lr:g}": curves[(layout, lr)] for layout, lr in sorted((la, lr) for la in ("pre", "post") for lr in lrs)}
    return value, {"steps": ns["STEPS"], "vocab": ns["VOCAB"], "lrs": lrs}


PROBES: dict[str, Probe] = {"ex04_pre_block": _probe_block("PreNormBlock", "pre"), "ex04_post_block": _probe_block("PostNormBlock", "post"),
                            "ex04_train": _probe_train, "ex04_comparison": _probe_comparison}


def diagnose_tasks(namespace: dict[str, Any], only: Iterable[str] | None = None) -> dict[str, list[Finding]]:
    """``{grade_id: findings}`` about the student's ex04 code in ``namespace``: the named problems, the task's mutants
    (:mod:`.mutants.ex04`), then the grader's judges on fresh inputs for every task without one. Never raises."""
    def post() -> list[Finding]:
        with on_reference_init(namespace):  # Task 4b is judged on its own, as in its test
            return check_parts(namespace, [("PostNormBlock", lambda cls: _diagnose_block("PostNormBlock", cls, "post"))])

    by_task: dict[str, Any] = {
        "ex04_pre_block": lambda: check_parts(namespace, [("PreNormBlock", lambda cls: _diagnose_block("PreNormBlock", cls, "pre"))]),
        "ex04_post_block": post, "ex04_train": lambda: check_parts(namespace, [("train_curve", _diagnose_train)])}
    if "curves" not in namespace:
        by_task["ex04_comparison"] = [Finding(Pitfall.GENERAL, _("curves is missing"), _("the notebook holds no curves."),
                                              fix=_("run Task 4d's cell to fill curves"))]
    found_by = explained(namespace, PROBES, by_task, only=only)
    if found_by.get("ex04_train") and "ex04_comparison" in found_by:  # Task 4d's curves come from the student's train_curve
        found_by["ex04_comparison"] = with_cause(found_by["ex04_comparison"], "ex04_comparison",
                                                 _("this fails because `train_curve` above is wrong (fix Task 4c first)"))
    return found_by


def diagnose(namespace: dict[str, Any]) -> list[Finding]:
    """Findings about the student's ex04 code in ``namespace`` (empty when all looks right); see :func:`diagnose_tasks`."""
    return flat(diagnose_tasks(namespace))
