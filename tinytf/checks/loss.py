"""``diagnose_lm_loss``: black-box property checks of a next-token loss on right-, left- and unpadded batches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..translation import gettext as _
from .catalog import Pitfall
from .findings import Finding, found
from .probe import crash_finding, only_for, quietly

__all__ = ["diagnose_lm_loss"]


class Case(NamedTuple):
    """One probe batch: logits ``[B, T, V]``, ids ``[B, T]`` padded with ``pad``, and its description."""

    logits: torch.Tensor
    ids: torch.Tensor
    pad: int
    desc: str


def _reference_lm_loss(logits: torch.Tensor, ids: torch.Tensor, pad: int) -> torch.Tensor:
    pred, target = logits[:, :-1], ids[:, 1:]  # position t predicts token t+1
    return F.cross_entropy(pred.reshape(-1, pred.size(-1)), target.reshape(-1), ignore_index=pad)


def _lm_batch(gen: torch.Generator, vocab: int, pad: int, lengths: Sequence[int], t: int, left: Sequence[bool]):
    b = len(lengths)
    ids = torch.randint(0, vocab - 1, (b, t), generator=gen)
    ids = ids + (ids >= pad).long()  # real tokens never equal pad
    for i, (n, is_left) in enumerate(zip(lengths, left)):
        if is_left:
            ids[i, : t - n] = pad
        else:
            ids[i, n:] = pad
    logits = torch.randn(b, t, vocab, generator=gen) * 2
    return logits, ids


def _cases(gen: torch.Generator, vocab: int) -> list[Case]:
    spec = ((0, (6, 4, 3), (False,) * 3, 6, _("the right-padded batch (pad_id=0, T=6)")),
            (0, (5, 6, 2), (True,) * 3, 6, _("the left-padded batch (pad_id=0, T=6)")),
            (vocab - 1, (9, 7, 3), (False, True, False), 9, _("the mixed-padding batch (pad_id={value}, T=9)").format(value=vocab - 1)),
            (0, (6, 6), (False,) * 2, 6, _("the batch without padding (T=6)")))
    return [Case(*_lm_batch(gen, vocab, pad, lengths, t, left), pad, desc) for pad, lengths, left, t, desc in spec]


def _where(cases: list[Case], which: list[int]) -> str:
    return only_for([_("on {desc}").format(desc=cases[i].desc) for i in which], len(which), len(cases))


def _base_losses(fn: Callable, cases: list[Case]) -> tuple[list[torch.Tensor], list[Finding]]:
    """The loss on every case, or the finding that stops the diagnosis (crash, not a scalar, detached, NaN)."""
    base = []
    for c in cases:
        lg = c.logits.clone().requires_grad_(True)
        try:
            loss = fn(lg, c.ids.clone(), pad_id=c.pad)
        except Exception as exc:  # noqa: BLE001
            hint = (_("The loss is called as fn(logits, ids, pad_id=PAD), the signature of tinytf.lm_loss.")
                    if isinstance(exc, TypeError) and "pad_id" in str(exc) else "")
            return [], [crash_finding(_("loss on logits {logits_shape}, ids {ids_shape}")
                .format(logits_shape=list(c.logits.shape), ids_shape=list(c.ids.shape)), exc, Pitfall.GENERAL, hint)]
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            got = _("shape {loss_shape}").format(loss_shape=list(loss.shape)) if isinstance(loss, torch.Tensor) else type(loss).__name__
            return [], [found(Pitfall.GENERAL, _("loss is not a scalar tensor"), _("got {got}.").format(got=got),
                              fix=_("return a 0-d tensor: the mean over the real target tokens"))]
        if not loss.requires_grad:
            return [], [found(Pitfall.GENERAL, _("loss is detached from the logits"),
                              _("it does not require grad, so backward() cannot train the model."),
                              fix=_("do not call .item(), .detach() or torch.tensor(...) on it"))]
        if not torch.isfinite(loss):
            return [], [Finding(Pitfall.GENERAL, _("non-finite loss"), _("got {loss} on ordinary random logits.").format(loss=float(loss)))]
        base.append(loss.detach())
    return base, []


def _shift_step(call: Callable, cases: list[Case], base: list[torch.Tensor], gen: torch.Generator, vocab: int,
                tol: float) -> list[Finding]:
    """Pitfall 13: the loss must ignore the last position's logits and the first token, on every case."""
    backwards, unshifted, evidence = [], [], set()
    for n, (c, loss) in enumerate(zip(cases, base)):
        lg = c.logits.clone()
        lg[:, -1] = torch.randn(lg[:, -1].shape, generator=gen) * 3
        uses_last = not torch.allclose(call(lg, c.ids, c.pad), loss, atol=tol)
        lg = c.logits.clone()
        lg[:, 0] = torch.randn(lg[:, 0].shape, generator=gen) * 3
        uses_first_logits = not torch.allclose(call(lg, c.ids, c.pad), loss, atol=tol)
        ids2 = c.ids.clone()
        new = (ids2[:, 0] + 1) % vocab
        new = torch.where(new == c.pad, (new + 1) % vocab, new)  # another real token
        ids2[:, 0] = torch.where(ids2[:, 0] != c.pad, new, ids2[:, 0])
        uses_first_id = not torch.allclose(call(c.logits, ids2, c.pad), loss, atol=tol)
        if uses_last and not uses_first_logits:
            backwards.append(n)
        elif uses_last or uses_first_id:
            unshifted.append(n)
            evidence |= {_("it depends on the logits at the last position (which have no next token)")} if uses_last else set()
            evidence |= {_("it depends on the first token (which nothing predicts)")} if uses_first_id else set()
    findings = []
    if backwards:
        findings.append(found(Pitfall.UNSHIFTED_TARGETS, _("targets shifted the wrong way"),
                              _("the loss ignores the first position's logits and uses the last one's: logits[:, 1:] were paired "
                              "with ids[:, :-1]. Position t predicts token t+1."), where=_where(cases, backwards)))
    if unshifted:
        findings.append(found(Pitfall.UNSHIFTED_TARGETS, _("targets not shifted"),
                              _(" and ").join(sorted(evidence, reverse=True)).capitalize() + _(": each position is scored against "
                              "its own input token, which it can see."), where=_where(cases, unshifted)))
    return findings


def _pad_step(call: Callable, cases: list[Case], base: list[torch.Tensor], gen: torch.Generator, vocab: int,
              tol: float) -> list[Finding]:
    """Pitfall 14: logits whose target is padding must not matter, nor extra padding columns."""
    scored = []
    for n, (c, loss) in enumerate(zip(cases, base)):
        target_pad = torch.zeros_like(c.ids, dtype=torch.bool)
        target_pad[:, :-1] = c.ids[:, 1:] == c.pad  # logits at t are scored against ids[t+1]
        lg = c.logits.clone()
        lg[target_pad] = torch.randn(int(target_pad.sum()), vocab, generator=gen) * 3
        if not torch.allclose(call(lg, c.ids, c.pad), loss, atol=tol):
            scored.append(n)
    if scored:
        return [found(Pitfall.PADDING_IN_LOSS, _("padding tokens counted in the loss"),
                      _("changing the logits at positions whose target is padding changed the loss, so pad targets are scored "
                      "(mask by target != pad_id, not by the input token)."), where=_where(cases, scored))]
    denom = []
    for n, (c, loss) in enumerate(zip(cases, base)):
        extra = 3
        ids2 = torch.cat([c.ids, torch.full((c.ids.size(0), extra), c.pad)], dim=1)  # same real targets, more pad targets
        lg2 = torch.cat([c.logits, torch.randn(c.ids.size(0), extra, vocab, generator=gen)], dim=1)
        try:
            if not torch.allclose(call(lg2, ids2, c.pad), loss, atol=tol):
                denom.append(n)
        except Exception:  # noqa: BLE001
            pass
    if denom:
        return [found(Pitfall.PADDING_IN_LOSS, _("padding in the denominator"),
                      _("appending padding columns (no new real tokens) changed the loss: the sum over real tokens is divided by "
                      "all positions, pads included. cross_entropy(..., ignore_index=pad_id) with reduction='mean' divides by "
                      "the real target tokens ((target != pad_id).sum())."), where=_where(cases, denom))]
    return []


@quietly
def diagnose_lm_loss(fn: Callable, *, vocab: int = 11, tol: float = 1e-5) -> list[Finding]:
    """Diagnose a next-token loss called as ``fn(logits, ids, pad_id=PAD) -> loss`` (the signature of
    :func:`tinytf.lm_loss`): logits ``[B, T, V]`` computed from ids ``[B, T]``; ``fn`` shifts itself.

    Black-box property checks on four batches (right-, left-, mixed- and unpadded; two pad ids; T = 6
    and 9): the loss must not depend on the logits at the last position nor on the first token
    (``UNSHIFTED_TARGETS``: missing or reversed shift); nor on the logits whose target is padding, nor
    change when extra padding columns are appended (``PADDING_IN_LOSS``). It must return a scalar
    tensor that can be back-propagated, equal to the mean over real target tokens. Each finding
    names the batches that show it, so a loss wrong for left padding only is named too.
    """
    gen = torch.Generator().manual_seed(99)
    cases = _cases(gen, vocab)
    base, stop = _base_losses(fn, cases)
    if stop:
        return stop

    def call(logits: torch.Tensor, ids: torch.Tensor, pad: int) -> torch.Tensor:
        return fn(logits.clone(), ids.clone(), pad_id=pad)

    findings = _shift_step(call, cases, base, gen, vocab, tol) or _pad_step(call, cases, base, gen, vocab, tol)
    if findings:
        return findings
    diffs = [abs(float(loss) - float(_reference_lm_loss(c.logits, c.ids, c.pad))) for c, loss in zip(cases, base)]
    off = [n for n, diff in enumerate(diffs) if diff > 1e-4]
    if off:
        findings.append(Finding(Pitfall.GENERAL, _("loss differs from the mean next-token cross-entropy"),
                                _("it is off by up to {max:.3g} from cross_entropy(logits[:, :-1], ids[:, 1:], ignore_index=pad_id) "
                                  "(mean over real target tokens), though shift and padding look right. Check the reduction (sum vs "
                                  "mean, per sequence vs per token) and the axes passed to cross_entropy. ").format(max=max(diffs))
                                + _where(cases, off)))
    return findings
