"""Exercise 8's probes (the judges' inputs drawn afresh on the student's machine) and tinytf's
versions of parts B-D, which the training task runs on when the student's are wrong.

``PROBES[grade_id](namespace, generator) -> (value, inputs)`` calls the student's objects like the
hidden test of ``grade_id``; the training task is judged from the notebook's own run (``report``,
``model``) plus a reduced fresh run, as its hidden test does.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from . import Probe, swapped

__all__ = ["PROBES", "reference_cosine_lr", "reference_parts", "earlier_parts_wrong", "reduced_run"]

EDGE_ROWS = 200  # rows drawn from a sequence with 4 windows: each window is drawn, except with probability 4 · (3/4)^200

REPORT_KEEP = ("val_loss", "train_loss", "tokens_per_s", "peak_memory_bytes", "memory", "lrs", "losses")


def reference_cosine_lr(step: int, *, max_lr: float, min_lr: float, warmup: int, total: int) -> float:
    """Linear warm-up ``max_lr * (step + 1) / warmup``, cosine from max_lr to min_lr until ``total``, then min_lr."""
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    p = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * p))


def reference_parts() -> dict[str, Callable[..., Any]]:
    """tinytf's ``get_batch``, ``next_char_loss`` and ``cosine_lr`` (what ``train`` calls)."""
    from tinytf import lm_loss

    def get_batch(data: torch.Tensor, block: int, batch: int, generator: torch.Generator) -> torch.Tensor:
        starts = torch.randint(0, len(data) - block + 1, (batch,), generator=generator)
        return torch.stack([data[s : s + block] for s in starts.tolist()])

    def next_char_loss(logits: torch.Tensor, ids: torch.Tensor, pad_id: int | None = None) -> torch.Tensor:
        return lm_loss(logits, ids, pad_id=pad_id)

    return {"get_batch": get_batch, "next_char_loss": next_char_loss, "cosine_lr": reference_cosine_lr}


def _agrees(name: str, fn: Any) -> bool:
    from tinytf import lm_loss

    g = torch.Generator().manual_seed(3)
    if name == "get_batch":
        x = fn(torch.arange(30), 5, 7, g)
        return isinstance(x, torch.Tensor) and tuple(x.shape) == (7, 5) and all(
            torch.equal(r, torch.arange(int(r[0]), int(r[0]) + 5)) for r in x)
    if name == "next_char_loss":
        logits, ids = torch.randn(2, 6, 7, generator=g), torch.randint(1, 7, (2, 6), generator=g)
        ids[1, 4:] = 0
        return all(torch.allclose(torch.as_tensor(fn(logits, ids, *p)).float().reshape(()),
                                  lm_loss(logits, ids, pad_id=p[0] if p else None), atol=1e-5) for p in ((), (0,)))
    sched = {"max_lr": 1.0, "min_lr": 0.1, "warmup": 3, "total": 12}
    return all(abs(float(fn(s, **sched)) - reference_cosine_lr(s, **sched)) < 1e-9 for s in range(15))


def earlier_parts_wrong(namespace: dict[str, Any]) -> list[str]:
    """The names among get_batch, next_char_loss, cosine_lr whose student version is missing, raises or is wrong."""
    wrong = []
    for name in reference_parts():
        try:
            ok = _agrees(name, namespace[name])
        except Exception:  # noqa: BLE001 - a stub or a crash counts as wrong
            ok = False
        if not ok:
            wrong.append(name)
    return wrong


def _size(gen: torch.Generator, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi, (), generator=gen))


def _probe_vocab(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?\n0123456789"
    fresh = "".join(alphabet[int(i)] for i in torch.randint(0, len(alphabet), (_size(gen, 10, 120),), generator=gen))
    text = "hello world" + fresh  # repeated characters, first seen out of sorted order: on every draw
    stoi, itos = ns["build_vocab"](text)
    ids = ns["encode"](text, stoi)
    value = {"itos": list(itos), "stoi": {str(k): int(v) for k, v in stoi.items()}, "ids": ids, "decoded": ns["decode"](ids, itos)}
    return value, {"text": text}


def _probe_batch(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    data = torch.randint(0, 1000, (_size(gen, 30, 200),), generator=gen)
    block, batch = _size(gen, 2, 16), _size(gen, 1, 10)
    x = ns["get_batch"](data, block, batch, torch.Generator().manual_seed(_size(gen, 0, 10**6)))
    edge = torch.arange(block + 3) + 1000  # 4 possible windows, 200 rows: the last window is drawn (all but 1e-25 of the time)
    at_edge = ns["get_batch"](edge, block, EDGE_ROWS, torch.Generator().manual_seed(_size(gen, 0, 10**6)))
    return {"rows": x, "edge": at_edge}, {"data": data, "block": block, "batch": batch, "edge": edge}


def _probe_loss(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    b, t, v = _size(gen, 1, 4), _size(gen, 4, 10), _size(gen, 3, 20)
    logits, ids = torch.randn(b, t, v, generator=gen) * 2, torch.randint(1, v, (b, t), generator=gen)
    padded = ids.clone()
    for r in range(b):
        padded[r, _size(gen, 2, t + 1):] = 0
    padded[0, 2:] = 0  # row 0 always ends in padding: a loss that counts it shows on every draw
    fn = ns["next_char_loss"]
    return {"plain": fn(logits, ids), "padded": fn(logits, padded, pad_id=0)}, {"logits": logits, "ids": ids, "padded_ids": padded}


def _probe_lr(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    cfg: dict[str, Any] = {"max_lr": float(torch.rand((), generator=gen)) * 1e-2 + 1e-3, "warmup": _size(gen, 1, 8)}
    cfg["min_lr"] = cfg["max_lr"] * float(torch.rand((), generator=gen)) * 0.5
    cfg["total"] = cfg["warmup"] + _size(gen, 1, 40)
    return [float(ns["cosine_lr"](s, **cfg)) for s in range(cfg["total"] + 5)], cfg


def _probe_train(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    """The notebook's own run (``report``, ``model``) and a reduced fresh run of ``train``. When get_batch,
    next_char_loss or cosine_lr is wrong, the graded cell retrains on tinytf's versions (a full run, too slow
    here): then both runs are reduced ones on tinytf's parts, the main one on a sequence a model learns in a
    few steps, so that ``train`` is judged on its own."""
    wrong = earlier_parts_wrong(ns)
    if not wrong and not isinstance(ns.get("report"), dict):
        raise NotImplementedError  # the training cell has not run: the diagnosis says so
    with swapped(ns, **{name: reference_parts()[name] for name in wrong}):
        main, main_inputs = reduced_run(ns, gen, learnable=True) if wrong else _notebook_run(ns)
        fresh, fresh_inputs = reduced_run(ns, gen, learnable=False)
    inputs = {**main_inputs, **{f"fresh_{key}": x for key, x in fresh_inputs.items()}}
    return {"main": main, "fresh": fresh}, inputs


def _notebook_run(ns: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    return ({k: ns["report"].get(k) for k in REPORT_KEEP},
            {"config": ns["CONFIG"], "schedule": ns["SCHEDULE"], "state_dict": dict(ns["model"].state_dict()), "val_data": ns["val_data"]})


def reduced_run(ns: dict[str, Any], gen: torch.Generator, *, learnable: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """``train`` on a one-layer model: random tokens, or (``learnable``) a sequence whose next token follows
    from the current one, which 60 steps learn far below log(vocab)."""
    from tinytf import TinyLanguageModel

    vocab = _size(gen, 5, 20)
    if learnable:
        data = (torch.arange(160) * _size(gen, 1, 3) + _size(gen, 0, vocab)) % vocab
        sched = {"steps": 60, "block": 8, "batch": 8, "max_lr": 1e-2, "min_lr": 1e-3, "warmup": _size(gen, 1, 5)}
    else:
        data = torch.randint(0, vocab, (160,), generator=gen)
        sched = {"steps": _size(gen, 3, 8), "block": 8, "batch": 4, "max_lr": 1e-2, "min_lr": 1e-3, "warmup": _size(gen, 1, 3)}
    with torch.random.fork_rng(devices=[]):  # the notebook's own random state is left alone
        torch.manual_seed(_size(gen, 0, 10**6))
        model = TinyLanguageModel(vocab=vocab, dim=16, heads=2, layers=1, max_tokens=8)
        report, _, _ = ns["train"](model, data[:120], data[120:], generator=torch.Generator().manual_seed(1), **sched)
    return ({k: report.get(k) for k in REPORT_KEEP},
            {"config": model.config.to_dict(), "schedule": sched, "state_dict": dict(model.state_dict()), "val_data": data[120:]})


def _probe_ckpt(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    from tinytf import TinyLanguageModel

    model = TinyLanguageModel(vocab=_size(gen, 5, 30), dim=8, heads=2, layers=_size(gen, 1, 3), max_tokens=10)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    model.eval()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    ids = torch.randint(0, model.config.vocab, (2, 10), generator=gen)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.pt"
        ns["save_checkpoint"](path, model, opt, sched, 7)
        restored, _ = ns["load_checkpoint"](path, "cpu")
        raw = torch.load(path, map_location="cpu", weights_only=True)
    with torch.no_grad():
        logits = restored(ids)
    value = {"logits": logits, "keys": sorted(raw), "step": raw.get("step"), "training": bool(restored.training)}
    return value, {"ids": ids, "config": model.config.to_dict(), "state_dict": dict(model.state_dict())}


PROBES: dict[str, Probe] = {"ex08_vocab": _probe_vocab, "ex08_batch": _probe_batch, "ex08_loss": _probe_loss, "ex08_lr": _probe_lr,
                            "ex08_train": _probe_train, "ex08_ckpt": _probe_ckpt}
