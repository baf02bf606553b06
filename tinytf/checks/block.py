"""``diagnose_block``: property checks of a causal block ``[B, T, D] -> [B, T, D]`` on two input shapes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..translation import gettext
from ..translation import gettext as _
from .catalog import Pitfall
from .findings import Finding, found
from .probe import crash_finding, first_output, only_for, quietly

__all__ = ["diagnose_block"]

_DIM_ATTRS = ("dim", "d_model", "embed_dim", "hidden_size", "n_embd", "width")
_LEN_ATTRS = ("max_tokens", "block_size", "max_len", "max_seq_len", "context_length")


def _int_attr(obj: object, names: Sequence[str]) -> int | None:
    for name in names:
        val = getattr(obj, name, None)
        if isinstance(val, int) and not isinstance(val, bool) and val > 0:
            return val
    return None


def _infer_dim(module: nn.Module) -> int | None:
    """D from ``module.dim``-like attributes, else the first LayerNorm / BatchNorm / Linear inside it."""
    if (val := _int_attr(module, _DIM_ATTRS)) is not None:
        return val
    for sub in module.modules():
        if isinstance(sub, nn.LayerNorm):
            return int(sub.normalized_shape[-1])
        if isinstance(sub, nn.modules.batchnorm._BatchNorm):
            return int(sub.num_features)
        if isinstance(sub, nn.Linear):
            return int(sub.in_features)
        if sub is not module and (val := _int_attr(sub, _DIM_ATTRS)) is not None:
            return val
    return None


def _max_len(module: nn.Module) -> int | None:
    return next((val for sub in module.modules() if (val := _int_attr(sub, _LEN_ATTRS)) is not None), None)


def _forward(m: nn.Module, x: torch.Tensor, seed: int, *, grad: bool = True) -> torch.Tensor:
    torch.manual_seed(seed)
    with torch.set_grad_enabled(grad):
        out = first_output(m(x))  # a module may return (out, extras)
        return out.detach() if isinstance(out, torch.Tensor) else out


def _on(xs: Sequence[torch.Tensor], which: Sequence[int]) -> str:
    return only_for([_("for x {shape}").format(shape=list(xs[i].shape)) for i in which], len(which), len(xs))


def _shape_step(m: nn.Module, xs: list[torch.Tensor]) -> tuple[list[Finding], list[torch.Tensor], bool]:
    """Pitfall 8 (and crashes): every input must come back with its own shape. Returns the findings,
    the inputs the block ran on (a crash on the short one drops it), and whether to stop."""
    m.eval()
    wrong, ran, findings = [], [], []
    for i, x in enumerate(xs):
        try:
            out = _forward(m, x, 0)
        except Exception as exc:  # noqa: BLE001
            shape_err = isinstance(exc, RuntimeError) and ("must match the size" in str(exc) or "size of tensor" in str(exc))
            hint = (gettext("A residual sum x + branch(x) needs the branch to return [B, T, D]; a widened FFN (D -> 4D) must project "
                    "back to D before the addition.") if shape_err else "")
            pitfall = Pitfall.RESIDUAL_SHAPE if shape_err else Pitfall.GENERAL
            findings.append(crash_finding(gettext("block on x {x_shape}").format(x_shape=list(x.shape)), exc, pitfall, hint))
            if i == 0 or shape_err:
                return findings, ran, True
            continue
        if not isinstance(out, torch.Tensor):
            return [Finding(Pitfall.GENERAL, gettext("block does not return a tensor"), gettext("got {type}; expected [B, T, D].")
                .format(type=type(out).__name__))], ran, True
        ran.append(x)
        if out.shape != x.shape:
            wrong.append((i, list(out.shape)))
    if not wrong:
        return findings, ran, False
    i, got = wrong[0]
    return [found(Pitfall.RESIDUAL_SHAPE, gettext("output shape differs from the input"),
                  gettext("x {shape} -> {got}. A block maps [B, T, D] -> [B, T, D]: every residual branch (attention, FFN) must end in D "
                          "features; the FFN's 4D is only its hidden width.")
                              .format(shape=list(xs[i].shape), got=got), where=_on(xs, [j for j, _ in wrong]))], ran, True


def _random(m: nn.Module, x: torch.Tensor, tol: float, *, grad: bool) -> bool:
    """Do two calls with different dropout seeds differ?"""
    return not torch.allclose(_forward(m, x, 0, grad=grad), _forward(m, x, 1, grad=grad), atol=tol, equal_nan=True)


def _dropout_step(m: nn.Module, xs: list[torch.Tensor], tol: float) -> list[Finding]:
    """Pitfall 9: eval() must be deterministic with and without grad; train() must not depend on no_grad."""
    m.eval()
    with_grad = [i for i, x in enumerate(xs) if _random(m, x, tol, grad=True)]
    without = [i for i, x in enumerate(xs) if _random(m, x, tol, grad=False)]
    if with_grad and not without:
        return [found(Pitfall.TRAIN_EVAL, _("dropout switched by autograd, not by eval()"),
                      _("in eval() the output is random with gradients enabled but deterministic under torch.no_grad(). "
                      "Gate dropout on self.training (nn.Dropout does), not on torch.is_grad_enabled(); "
                      "no_grad/inference_mode do not replace model.eval()."), where=_on(xs, with_grad))]
    if with_grad or without:
        which = sorted(set(with_grad) | set(without))
        return [found(Pitfall.TRAIN_EVAL, _("dropout stays on in eval()"),
                      _("two calls on the same input in eval() gave different outputs; F.dropout defaults to training=True, "
                      "so pass training=self.training."), where=_on(xs, which))]
    m.train()
    tied = [i for i, x in enumerate(xs) if _random(m, x, tol, grad=True) and not _random(m, x, tol, grad=False)]
    m.eval()
    if tied:
        return [found(Pitfall.TRAIN_EVAL, _("no_grad changes training behaviour"),
                      _("in train() the output is random (dropout) with gradients but deterministic under torch.no_grad(). "
                      "Dropout must follow self.training only."), where=_on(xs, tied))]
    return []


def _batch_step(factory: Callable[[], nn.Module], m: nn.Module, x: torch.Tensor, gen: torch.Generator, tol: float) -> list[Finding]:
    """Pitfall 7: sequence 0's output must not change when only the other sequences change (eval and train)."""
    x_other = x.clone()
    x_other[1:] = torch.randn(x[1:].shape, generator=gen).to(x.device, x.dtype)
    bns = [name or type(sub).__name__ for name, sub in m.named_modules() if isinstance(sub, nn.modules.batchnorm._BatchNorm)]
    mixed = None
    for mode in ("eval", "train"):
        trial = factory() if mode == "train" else m  # a fresh module: train-mode BatchNorm updates its running stats
        trial.to(x.device)
        trial.train(mode == "train")
        try:
            a, b = _forward(trial, x, 3), _forward(trial, x_other, 3)
        except Exception:  # noqa: BLE001
            continue
        if not torch.allclose(a[0], b[0], atol=tol):
            mixed = mode
            break
    m.eval()
    if not (mixed or bns):
        return []
    where = _(" It contains {value_join}.").format(value_join=', '.join(bns)) if bns else ""
    msg = (_("in {mixed}() the output for sequence 0 changed when only the *other* sequences of the batch changed: the block normalises "
             "(or mixes) across the batch.").format(mixed=mixed) if mixed else _("the block holds batch-statistics normalisation."))
    return [found(Pitfall.BATCH_NORM, _("normalises across the batch instead of the features"),
                  msg + where + _(" A Transformer normalises each token's own D features, the same in train and eval, "
                  "independent of the batch."))]


def _leaks(m: nn.Module, x: torch.Tensor, gen: torch.Generator, tol: float) -> set[tuple[int, int]] | None:
    """(query i, key j > i) pairs where changing token j changed output i; None if the output is not finite."""
    base = _forward(m, x, 0)
    if not torch.isfinite(base).all():
        return None
    leaks = set()
    for j in range(1, x.size(1)):
        x2 = x.clone()
        x2[:, j] += torch.randn(x2[:, j].shape, generator=gen).to(x.device, x.dtype)
        try:
            out2 = _forward(m, x2, 0)
        except Exception:  # noqa: BLE001
            break
        changed = (out2 - base).abs().amax(dim=(0, 2)) > tol * (1 + float(base.abs().max()))  # [T]
        leaks |= {(i, j) for i in range(j) if bool(changed[i])}
    return leaks


def _leak_step(m: nn.Module, xs: list[torch.Tensor], gen: torch.Generator, tol: float, *, batch_stats: bool) -> list[Finding]:
    """Pitfall 4 (or 7, LayerNorm over time): no output may depend on a later token, on any input.
    With ``batch_stats`` (pitfall 7 found) a NaN output is blamed on it (a batch of one has no spread)."""
    m.eval()
    per_x: dict[int, list[tuple[int, int]]] = {}
    for i, x in enumerate(xs):
        leaks = _leaks(m, x, gen, tol)
        if leaks is None and batch_stats:
            continue
        if leaks is None:
            return [found(Pitfall.CAUSAL_OFF_BY_ONE, _("non-finite output"),
                          _("the block outputs NaN or inf. A causal mask that blocks the diagonal leaves row 0 with nothing to "
                          "attend to: softmax over all -inf is NaN."), where=_on(xs, [i]) if len(xs) > 1 else "",
                          fix=_("keep the diagonal in the causal mask: ones(T, T).tril() (each token may read itself)"))]
        if leaks:
            per_x[i] = sorted(leaks)
    if not per_x:
        return []
    first = next(iter(per_x))
    leaks, t = per_x[first], xs[first].size(1)
    where = _on(xs, list(per_x))
    wide_ln = [name for name, sub in m.named_modules() if isinstance(sub, nn.LayerNorm) and len(sub.normalized_shape) > 1]
    if wide_ln:
        return [found(Pitfall.BATCH_NORM, _("LayerNorm over the time axis"),
                      _("{value_join} normalise over more than the last axis, so a token's output depends on later tokens (leaks such as "
                        "query {leaks} <- key {leaks2}). Use nn.LayerNorm(D).")
                            .format(value_join=', '.join(wide_ln), leaks=leaks[0][0], leaks2=leaks[0][1]), where=where, fix=False)]
    reach = max(j - i for i, j in leaks)
    detail = (_(" Every position sees exactly one token ahead: an off-by-one causal mask (tril(diagonal=1)).")
              if reach == 1 and len(leaks) == t - 1 else "")
    return [found(Pitfall.CAUSAL_OFF_BY_ONE, _("future tokens leak into earlier positions"),
                  _("changing token j changed the outputs at positions i < j, e.g. (i, j) = {leaks} for x {shape} (up to {reach} "
                    "ahead).{detail} Apply a causal mask (True = may attend) in every attention.")
                        .format(leaks=leaks[:4], shape=list(xs[first].shape), reach=reach, detail=detail), where=where)]


@quietly
def diagnose_block(factory: Callable[[], nn.Module], *, dim: int | None = None, tokens: int = 6, batch: int = 3,
                   seeds: Sequence[int] = (0, 1)) -> list[Finding]:
    """Diagnose a causal block: ``factory() -> nn.Module`` with ``module(x)`` ``[B, T, D] -> [B, T, D]``.

    The module is called with ``x`` only (extra arguments such as ``mask`` keep their defaults), on
    ``x [batch, T, D]`` and on a short single sequence ``x [1, T // 2, D]``. D is ``dim`` when given,
    else inferred from the module: an int attribute ``dim`` / ``d_model`` / ``embed_dim`` /
    ``hidden_size`` / ``n_embd``, else the first ``LayerNorm``, ``BatchNorm`` or ``Linear`` inside it.
    T is ``tokens``, capped by a ``max_tokens``-like attribute.

    Catches: future positions leaking into earlier ones (``CAUSAL_OFF_BY_ONE``), normalisation across
    the batch — BatchNorm, or LayerNorm over the time axis (``BATCH_NORM``), a residual branch that
    changes the shape (``RESIDUAL_SHAPE``), dropout that stays on in ``eval()``, or dropout switched by
    ``no_grad`` instead of ``train()``/``eval()`` (``TRAIN_EVAL``), and exceptions. Each is named from
    the inputs that show it, so a block wrong only for short or single sequences is named too.
    """
    try:
        torch.manual_seed(0)
        m = factory()
    except Exception as exc:  # noqa: BLE001
        return [crash_finding("factory()", exc)]
    if not isinstance(m, nn.Module):
        return [Finding(Pitfall.GENERAL, _("factory() did not return an nn.Module"), _("got {type}.").format(type=type(m).__name__))]
    d = dim if dim is not None else _infer_dim(m)
    if d is None:
        return [found(Pitfall.GENERAL, _("cannot infer the model width D"), _("no dim-like attribute, LayerNorm or Linear found."),
                      fix=_("call diagnose_block(factory, dim=D)"))]
    limit = _max_len(m)
    t = min(tokens, limit) if limit else tokens
    p = next(m.parameters(), None)
    dev, dt = (p.device, p.dtype) if p is not None else (torch.device("cpu"), torch.float32)
    gen = torch.Generator().manual_seed(7 + seeds[0])
    xs = [torch.randn(b, n, d, generator=gen).to(dev, dt) for b, n in ((batch, t), (1, max(2, t // 2)))]
    tol = 1e-5
    findings, xs, stop = _shape_step(m, xs)
    if stop:
        return findings
    mixing = _batch_step(factory, m, xs[0], gen, tol)
    findings += _dropout_step(m, xs, tol) + mixing
    for seed in seeds:
        probes = [torch.randn(*x.shape, generator=gen.manual_seed(100 + seed)).to(dev, dt) for x in xs]
        leak = _leak_step(m, probes, gen, tol, batch_stats=bool(mixing))
        if leak:
            return findings + leak
    return findings
