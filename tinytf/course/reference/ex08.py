"""Exercise 8 — a character-level language model: judges and the self-check.

Student code: ``build_vocab(text) -> (stoi, itos)``, ``encode(text, stoi)``, ``decode(ids, itos)``,
``get_batch(data, block, batch, generator)``, ``next_char_loss(logits, ids, pad_id=None)``,
``cosine_lr(step, *, max_lr, min_lr, warmup, total)``, ``train(...) -> (report, optimizer, scheduler)``,
``save_checkpoint(path, model, optimizer, scheduler, step)`` and ``load_checkpoint(path, device)``.
The training report is judged for plausibility: its validation loss is recomputed from the exported
weights and must be clearly below ``log(vocab)``; its schedule and memory ledger must be consistent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from tinytf.checks import Finding, Pitfall, found

from ...translation import gettext
from ...translation import gettext as _
from . import call_student, check_parts, explained, flat, stub_or, with_cause
from .ex08_probes import EDGE_ROWS, PROBES, earlier_parts_wrong, reference_cosine_lr
from .judging import judge
from .validators import has_keys, positive, shape_of, shapes, should_be

__all__ = ["reference_cosine_lr", "reference_evaluate", "diagnose", "diagnose_tasks"]

MARGIN = 0.75  # the trained model's validation loss must be below log(vocab) - MARGIN
REPORT_KEYS = ("val_loss", "train_loss", "tokens_per_s", "peak_memory_bytes", "memory", "lrs", "losses")
MEMORY_KEYS = ("parameters", "gradients", "optimizer_state", "saved_activations", "step_peak", "total")


@torch.no_grad()
def reference_evaluate(model: torch.nn.Module, data: torch.Tensor, block: int) -> float:
    """Mean next-token loss over the consecutive non-overlapping windows of ``block`` tokens of ``data``."""
    from tinytf import lm_loss

    n = len(data) // block
    windows = data[: n * block].view(n, block)
    return float(lm_loss(model.eval()(windows), windows))


def _model(config: dict[str, Any], state_dict: dict[str, torch.Tensor]) -> torch.nn.Module:
    from tinytf import TinyLanguageModel

    model = TinyLanguageModel.from_config(config)  # a full ModelConfig.to_dict() or only the sizes
    model.load_state_dict(state_dict, strict=True)
    return model.eval()


def _check_report(rep: Any, model: torch.nn.Module, val_data: torch.Tensor, schedule: dict[str, Any], what: str) -> float:
    """Consistency checks shared by the main and the fresh training report; returns the recomputed val loss."""
    has_keys(rep, REPORT_KEYS, _("{what}: the report").format(what=what))
    steps, block = int(schedule["steps"]), int(schedule["block"])
    val = reference_evaluate(model, val_data, block)
    got = positive(rep["val_loss"], _("{what}: val_loss").format(what=what))
    assert abs(got - val) < 1e-3, _("{what}: val_loss is not the validation loss of the trained model").format(what=what)
    for key in ("train_loss", "tokens_per_s", "peak_memory_bytes"):
        positive(rep[key], f"{what}: {key}")
    lrs, losses = rep["lrs"], rep["losses"]
    assert isinstance(lrs, list) and len(lrs) == steps, _("{what}: one learning rate per step").format(what=what)
    assert isinstance(losses, list) and len(losses) == steps, _("{what}: one loss per step").format(what=what)
    assert all(math.isfinite(float(x)) for x in losses), _("{what}: non-finite training loss").format(what=what)
    sched = {k: schedule[k] for k in ("max_lr", "min_lr", "warmup")}
    for s, lr in enumerate(lrs):
        assert abs(float(lr) - reference_cosine_lr(s, total=steps, **sched)) < 1e-9, (
            _("{what}: the learning rate at step {s} is off the schedule").format(what=what, s=s)
        )
    mem = rep["memory"]
    has_keys(mem, MEMORY_KEYS, _("{what}: the memory ledger").format(what=what))
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert int(mem["parameters"]) == params, _("{what}: the ledger's parameter bytes are wrong").format(what=what)
    assert int(mem["optimizer_state"]) >= 2 * params, _("{what}: AdamW keeps two tensors per parameter").format(what=what)
    assert int(mem["saved_activations"]) > 0 and int(mem["step_peak"]) >= int(mem["gradients"]), (
        _("{what}: implausible step memory").format(what=what))
    assert int(rep["peak_memory_bytes"]) == int(mem["total"]), _("{what}: peak_memory_bytes must be the ledger's total").format(what=what)
    return val


# ---- judges ---------------------------------------------------------------------------------------


@judge("ex08_vocab")
def _judge_vocab(value: Any, text: str) -> None:
    has_keys(value, ("itos", "stoi", "ids", "decoded"))
    itos = sorted(set(text))
    assert list(value["itos"]) == itos, _("itos must be the sorted distinct characters of the text")
    assert value["stoi"] == {ch: i for i, ch in enumerate(itos)}, _("stoi must map each character to its index in itos")
    ids = value["ids"]
    assert isinstance(ids, torch.Tensor) and ids.dtype == torch.long, _("encode must return a torch.long tensor")
    assert ids.tolist() == [itos.index(ch) for ch in text], _("encode gives the wrong ids")
    assert value["decoded"] == text, _("decode(encode(text)) must give the text back")


def _windows(value: Any, data: torch.Tensor, block: int, batch: int) -> list[int]:
    """The offsets of the rows of ``value``, a ``[batch, block]`` batch of windows of ``data``."""
    assert isinstance(value, torch.Tensor) and tuple(value.shape) == (batch, block), (
        _("get_batch must return [batch, block] = {value}").format(value=[batch, block])
    )
    windows = data.unfold(0, block, 1)  # [N - block + 1, block]: every allowed window
    starts = []
    for row in value:
        hits = (windows == row.to(windows.dtype)).all(dim=1).nonzero().flatten()
        assert hits.numel(), _("each row must be block consecutive tokens of data")
        starts.append(int(hits[0]))
    return starts


@judge("ex08_batch")
def _judge_batch(value: Any, data: torch.Tensor, block: int, batch: int, edge: torch.Tensor | None = None) -> None:
    block, batch = int(block), int(batch)
    if edge is None:  # a record of an older probe: the batch alone
        _windows(value, data, block, batch)
        return
    has_keys(value, ("rows", "edge"), _("the get_batch record"))
    _windows(value["rows"], data, block, batch)
    starts = _windows(value["edge"], edge, block, EDGE_ROWS)
    last = len(edge) - block
    assert max(starts) == last, _("get_batch never started a window at the last offset {last} of a sequence of {n} tokens "
                                  "(block {block}) in {rows} rows: offsets run from 0 to len(data) - block inclusive").format(
                                      last=last, n=len(edge), block=block, rows=EDGE_ROWS)


@judge("ex08_loss")
def _judge_loss(value: Any, logits: torch.Tensor, ids: torch.Tensor, padded_ids: torch.Tensor) -> None:
    from tinytf import lm_loss

    has_keys(value, ("plain", "padded"))
    for key, expected in (("plain", lm_loss(logits, ids)), ("padded", lm_loss(logits, padded_ids, pad_id=0))):
        got = value[key]
        assert isinstance(got, torch.Tensor) and got.numel() == 1, _("next_char_loss ({key}) must return a scalar tensor").format(key=key)
        assert torch.allclose(got.float().reshape(()), expected, atol=1e-5), (
            _("next_char_loss ({key}) differs from the shifted cross-entropy: {should_be}").format(key=key,
                should_be=should_be(got, expected, shapes(logits=logits, ids=ids if key == 'plain' else padded_ids))))


@judge("ex08_lr")
def _judge_lr(value: Any, max_lr: float, min_lr: float, warmup: int, total: int) -> None:
    assert isinstance(value, list) and len(value) == int(total) + 5, _("one learning rate per step")
    for s, lr in enumerate(value):
        expected = reference_cosine_lr(s, max_lr=max_lr, min_lr=min_lr, warmup=int(warmup), total=int(total))
        assert abs(float(lr) - expected) <= 1e-12 + 1e-9 * expected, _("cosine_lr is wrong at step {s}").format(s=s)


@judge("ex08_train")
def _judge_train(
    value: Any,
    config: dict,
    schedule: dict,
    state_dict: dict,
    val_data: torch.Tensor,
    fresh_config: dict,
    fresh_schedule: dict,
    fresh_state_dict: dict,
    fresh_val_data: torch.Tensor,
) -> None:
    has_keys(value, ("main", "fresh"))
    val = _check_report(value["main"], _model(config, state_dict), val_data, schedule, _("the main run"))
    chance = math.log(int(config["vocab"]))
    assert val < chance - MARGIN, _("the validation loss {val:.3f} is not clearly below log(vocab) = {chance:.3f}").format(val=val,
        chance=chance)
    _check_report(value["fresh"], _model(fresh_config, fresh_state_dict), fresh_val_data, fresh_schedule, _("a fresh run"))


@judge("ex08_ckpt")
def _judge_ckpt(value: Any, ids: torch.Tensor, config: dict, state_dict: dict) -> None:
    assert isinstance(value, dict) and {"logits", "keys", "step", "training"} <= set(value), _("incomplete record")
    missing = {"config", "model", "optimizer", "scheduler", "step"} - set(value["keys"])
    assert not missing, _("the checkpoint lacks {missing}").format(missing=sorted(missing))
    assert value["step"] == 7, _("the checkpoint must store the step it was given")
    assert value["training"] is False, _("load_checkpoint must return the model in eval mode")
    with torch.no_grad():
        expected = _model(config, state_dict)(ids)
    got = value["logits"]
    assert isinstance(got, torch.Tensor) and got.shape == expected.shape, _("the restored model gives logits of the wrong shape")
    assert torch.allclose(got.float(), expected, atol=1e-5, rtol=1e-5), (
        _("the restored model gives different logits: {should_be}").format(should_be=should_be(got, expected, shapes(ids=ids))))


# ---- self-check diagnosis -------------------------------------------------------------------------


def _diagnose_vocab(ns: dict[str, Any]) -> list[Finding]:
    text = "the cat sat."
    res, problem = call_student("build_vocab", ns["build_vocab"], text)
    if problem:
        return [problem]
    if not (isinstance(res, tuple) and len(res) == 2):
        return [found(Pitfall.GENERAL, _("build_vocab must return (stoi, itos)"), _("it returned {type}.").format(type=type(res).__name__),
                      fix=_("return a dict char -> id and the list of characters: return stoi, itos"))]
    stoi, itos = res
    if list(itos) != sorted(set(text)):
        return [found(Pitfall.GENERAL, _("itos is not the sorted distinct characters"),
                      _("for {text!r} itos is {itos!r}: the ids must not depend on the order of the text.").format(text=text,
                                                                                                                  itos=list(itos)),
                      fix="itos = sorted(set(text))")]  # code: the same in every language
    ids, problem = call_student("encode", ns["encode"], text, stoi)
    if problem:
        return [problem]
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long or ids.tolist() != [itos.index(c) for c in text]:
        return [found(Pitfall.GENERAL, _("encode gives the wrong ids"), _("encode({text!r}) gave {ids!r}.").format(text=text, ids=ids),
                      fix="return torch.tensor([stoi[ch] for ch in text], dtype=torch.long)")]
    back, problem = call_student("decode", ns["decode"], ids, itos)
    if problem:
        return [problem]
    if back != text:
        return [found(Pitfall.GENERAL, _("decode does not invert encode"),
                      _("decode(encode({text!r})) gave {back!r}.").format(text=text, back=back),
                      fix="return ''.join(itos[int(i)] for i in ids)")]
    return []


def _diagnose_batch(fn: Any) -> list[Finding]:
    data = torch.arange(50)
    x, problem = call_student("get_batch", fn, data, 6, 40, torch.Generator().manual_seed(0))
    if problem:
        return [problem]
    if not isinstance(x, torch.Tensor) or tuple(x.shape) != (40, 6):
        return [found(Pitfall.GENERAL, _("get_batch returns the wrong shape"), _("expected [batch, block] = [40, 6], got {x}.").format(
            x=shape_of(x)),
                      fix=_("stack batch rows of block tokens each: torch.stack([data[s : s + block] for s in starts])"))]
    if not all(torch.equal(r, torch.arange(int(r[0]), int(r[0]) + 6)) for r in x):
        return [found(Pitfall.GENERAL, _("get_batch rows are not consecutive tokens"),
                      _("on data = arange(50) a row is not a run of consecutive numbers."),
                      fix=_("row i is data[s : s + block] for a random offset s"))]
    return []


def _diagnose_lr(fn: Any) -> list[Finding]:
    sched = {"max_lr": 1.0, "min_lr": 0.1, "warmup": 4, "total": 20}
    got = []
    for s in range(24):
        lr, problem = call_student("cosine_lr", fn, s, **sched)
        if problem:
            return [problem]
        got.append(lr)
    ref = [reference_cosine_lr(s, **sched) for s in range(24)]
    try:
        if all(abs(float(a) - b) < 1e-9 for a, b in zip(got, ref)):
            return []
        if abs(float(got[0])) < 1e-12:
            return [found(Pitfall.GENERAL, _("the warm-up starts at zero"), _("cosine_lr(0) = 0, but step 0 already trains."),
                          fix=_("use max_lr * (step + 1) / warmup during the warm-up"))]
        if abs(float(got[-1]) - sched["min_lr"]) > 1e-9:
            return [
                found(Pitfall.GENERAL, _("the schedule does not end at min_lr"),
                      _("cosine_lr(23) with total=20 gave {got!r}, should be min_lr = {min_lr}.").format(got=got[-1],
                                                                                                          min_lr=sched['min_lr']),
                      fix=_("after total steps return min_lr; the cosine goes from max_lr to min_lr"))
            ]
    except (TypeError, ValueError):
        return [found(Pitfall.GENERAL, _("cosine_lr must return a float"), _("it returned {type}.").format(type=type(got[0]).__name__),
                      fix=_("return a number (float), not a tensor or a list"))]
    return [
        found(Pitfall.GENERAL, _("cosine_lr is off the schedule"),
              _("max_lr=1, min_lr=0.1, warmup=4, total=20: step {step}.").format(
                  step=next(_("{s} gave {a!r}, should be {b!r}").format(s=s, a=float(a), b=b)
                            for s, (a, b) in enumerate(zip(got, ref)) if not abs(float(a) - b) < 1e-9)),
              fix=_("min_lr + 0.5 * (max_lr - min_lr) * (1 + cos(pi * p)) with p = (step - warmup) / (total - warmup)"))
    ]


def _diagnose_ckpt(ns: dict[str, Any]) -> list[Any]:
    import tempfile
    from pathlib import Path

    from tinytf import TinyLanguageModel

    torch.manual_seed(21)
    model = TinyLanguageModel(vocab=13, dim=8, heads=2, layers=1, max_tokens=8).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.pt"
        _, problem = call_student("save_checkpoint", ns["save_checkpoint"], path, model, opt, sched, 3)
        if problem:
            return [problem]
        try:
            raw = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any failure to read the file is the finding
            return [
                found(Pitfall.GENERAL, gettext("the checkpoint cannot be read with torch.load(weights_only=True)"),
                      gettext("torch.load raised {type}.").format(type=type(err).__name__),
                      fix=gettext("store plain data only (state dicts, numbers), e.g. with tinytf.save_checkpoint"))
            ]
        res, problem = call_student("load_checkpoint", ns["load_checkpoint"], path, "cpu")
        if problem:
            return [problem]
    if not (isinstance(res, tuple) and len(res) == 2 and isinstance(res[0], torch.nn.Module)):
        return [found(Pitfall.GENERAL, gettext("load_checkpoint must return (model, checkpoint)"),
                      gettext("it returned {type}.").format(type=type(res).__name__),
                      fix=gettext("return the restored TinyLanguageModel and the tinytf.Checkpoint"))]
    restored = res[0]
    findings = []
    if restored.training:
        findings.append(found(Pitfall.TRAIN_EVAL, gettext("the restored model is in training mode"),
                              gettext("load_checkpoint returned a model with model.training = True: dropout would stay on."),
                              fix=gettext("call model.eval() on the restored model before returning it")))
    ids = torch.randint(0, 13, (2, 8), generator=torch.Generator().manual_seed(22))
    with torch.no_grad():
        if not torch.equal(restored.eval()(ids), model(ids)):
            findings.append(
                found(Pitfall.GENERAL, gettext("the restored model gives different outputs"),
                      gettext("in eval mode its logits differ from the saved model's."),
                      fix=gettext("save model.state_dict() and load it with strict=True"))
            )
    missing = sorted({"config", "model", "optimizer", "scheduler", "step"} - set(raw if isinstance(raw, dict) else ()))
    if missing:
        findings.append(found(Pitfall.GENERAL, gettext("the checkpoint is incomplete"),
                              gettext("it lacks {missing}.").format(missing=missing),
                              fix=gettext("pass the optimizer, the scheduler and step= to tinytf.save_checkpoint")))
    elif raw["step"] != 3:
        findings.append(found(Pitfall.GENERAL, gettext("the checkpoint stores the wrong step"),
                              gettext("saved with step=3, it stores {raw!r}.").format(raw=raw['step']),
                              fix=gettext("store the step it was given")))
    return findings


def diagnose_tasks(namespace: dict[str, Any], only: Iterable[str] | None = None) -> dict[str, list[Finding]]:
    """``{grade_id: findings}`` about the student's ex08 code in ``namespace``: the named checks, the task's mutants
    (:mod:`.mutants.ex08`), then the judges on fresh inputs for every task without a finding. Never raises."""
    from tinytf.checks import diagnose_lm_loss

    named: dict[str, Any] = {
        "ex08_vocab": lambda: check_parts(namespace, [(("build_vocab", "encode", "decode"), lambda *_: _diagnose_vocab(namespace))]),
        "ex08_batch": lambda: check_parts(namespace, [("get_batch", _diagnose_batch)]),
        "ex08_loss": lambda: check_parts(namespace, [("next_char_loss", lambda fn: stub_or("next_char_loss", diagnose_lm_loss(fn)))]),
        "ex08_lr": lambda: check_parts(namespace, [("cosine_lr", _diagnose_lr)]),
        "ex08_ckpt": lambda: check_parts(namespace, [(("save_checkpoint", "load_checkpoint"), lambda *_: _diagnose_ckpt(namespace))])}
    if not callable(namespace.get("train")):
        named["ex08_train"] = [Finding(Pitfall.GENERAL, _("train is missing"), _("the notebook defines no train(...)."),
                                       fix=_("define train(...) in the notebook (keep its name and signature) and run its cell"))]
    found_by = explained(namespace, PROBES, named, only=only)
    wrong = earlier_parts_wrong(namespace) if found_by.get("ex08_train") and callable(namespace.get("train")) else []
    if wrong:  # the graded cell retrains on tinytf's versions: so do the probe and the mutants' comparison
        names = ", ".join(f"`{name}`" for name in wrong)
        found_by["ex08_train"] = with_cause(found_by["ex08_train"], "ex08_train", _(
            "train was judged with tinytf's {names}, because yours above {value} wrong; this is train's own mistake").format(
                names=names, value='is' if len(wrong) == 1 else 'are'), every=True)
    return found_by


def diagnose(namespace: dict[str, Any]) -> list[Finding]:
    """Findings about the student's ex08 code in ``namespace`` (empty when all looks right); see :func:`diagnose_tasks`."""
    return flat(diagnose_tasks(namespace))
