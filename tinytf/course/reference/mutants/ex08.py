"""Exercise 8's mutants: the vocabulary, batches, the shifted loss, the schedule, the training loop, the checkpoint
(see :mod:`.`)."""

from __future__ import annotations

from typing import Any

import torch

from tinytf.checks import Pitfall

from ....translation import N_
from . import Correct, Family, Mutant

VOCAB = Family(
    task="ex08_vocab", cell="ex08_vocab_code", subject="build_vocab",
    source=("def build_vocab(text: str) -> tuple[dict[str, int], list[str]]:\n"
            "    itos = sorted(set(text))\n"
            "    stoi = {ch: i for i, ch in enumerate(itos)}\n"
            "    return stoi, itos\n"
            "\n"
            "\n"
            "def encode(text: str, stoi: dict[str, int]) -> torch.Tensor:\n"
            "    return torch.tensor([stoi[ch] for ch in text], dtype=torch.long)\n"
            "\n"
            "\n"
            "def decode(ids: torch.Tensor | list[int], itos: list[str]) -> str:\n"
            "    return \"\".join(itos[int(i)] for i in ids)\n"),
    mutants=(
        Mutant("first_seen", Pitfall.GENERAL, N_("itos is not the sorted distinct characters"),
               N_("your itos lists the characters in the order they first appear in the text; the vocabulary is sorted."),
               N_("itos = sorted(set(text))"), edits=(("itos = sorted(set(text))", "itos = list(dict.fromkeys(text))"),)),
        Mutant("duplicates", Pitfall.GENERAL, N_("itos keeps repeated characters"),
               N_("your itos has one entry per character of the text, repeats included: sorted(text), not sorted(set(text))."),
               N_("take each character once: itos = sorted(set(text))"), edits=(("itos = sorted(set(text))", "itos = sorted(text)"),)),
        Mutant("one_based", Pitfall.GENERAL, N_("stoi counts from 1"),
               N_("your ids start at 1: stoi maps itos[i] to i + 1, so decode (itos[id]) is off by one character."),
               N_("number from 0: stoi = {ch: i for i, ch in enumerate(itos)}"),
               edits=(("enumerate(itos)}", "enumerate(itos, 1)}"),)),
        Mutant("int32_ids", Pitfall.GENERAL, N_("encode gives the wrong ids"),
               N_("your ids are torch.int32; an embedding's indices are torch.long."),
               N_("dtype=torch.long"), edits=(("dtype=torch.long)", "dtype=torch.int32)"),)),
        Mutant("spaced_decode", Pitfall.GENERAL, N_("decode does not invert encode"),
               N_("your decode puts a space between the characters: ' '.join(...) instead of ''.join(...)."),
               N_("join with the empty string: ''.join(itos[int(i)] for i in ids)"),
               edits=(('return "".join(itos[int(i)] for i in ids)', 'return " ".join(itos[int(i)] for i in ids)'),)),
    ),
    correct=(Correct("loop", edits=(("stoi = {ch: i for i, ch in enumerate(itos)}", "stoi = dict(zip(itos, range(len(itos))))"),)),
             Correct("index_lists", edits=(('return "".join(itos[int(i)] for i in ids)',
                                            'return "".join([itos[i] for i in torch.as_tensor(ids).tolist()])'),))),
)

_STARTS = "len(data) - block + 1"

BATCH = Family(
    task="ex08_batch", cell="ex08_batch_code", subject="get_batch",
    source=("def get_batch(data: torch.Tensor, block: int, batch: int, generator: torch.Generator) -> torch.Tensor:\n"
            f"    starts = torch.randint(0, {_STARTS}, (batch,), generator=generator)\n"
            "    return torch.stack([data[s : s + block] for s in starts.tolist()])\n"),
    mutants=(
        Mutant("last_start_missed", Pitfall.GENERAL, N_("get_batch never starts a window at the last offset"),
               N_("your offsets are drawn from 0 … len(data) - block - 1: randint's upper end is exclusive, so the last window "
                  "data[len(data) - block:] is never drawn."),
               N_("draw offsets with torch.randint(0, len(data) - block + 1, …)"), edits=((_STARTS, "len(data) - block"),)),
        Mutant("overrun", Pitfall.GENERAL, N_("get_batch starts windows too close to the end"),
               N_("your offsets reach len(data) - 1: a window starting there has fewer than block tokens."),
               N_("draw offsets with torch.randint(0, len(data) - block + 1, …)"), edits=((_STARTS, "len(data)"),)),
        Mutant("stacked_dim1", Pitfall.ORIENTATION, N_("get_batch returns [block, batch]"),
               N_("your rows are stacked along dim 1: the batch is [block, batch], the transpose of [batch, block]."),
               N_("stack the windows as rows: torch.stack(windows) (dim 0)"),
               edits=(("for s in starts.tolist()])", "for s in starts.tolist()], dim=1)"),)),
        Mutant("window_plus_one", Pitfall.GENERAL, N_("get_batch rows hold block + 1 tokens"),
               N_("your windows are data[s : s + block + 1]: one token more than block."),
               N_("take data[s : s + block]"), edits=(("[data[s : s + block] for s", "[data[s : s + block + 1] for s"),)),
        Mutant("independent_tokens", Pitfall.GENERAL, N_("get_batch rows are not consecutive tokens"),
               N_("your rows are tokens drawn one by one at random positions; each row must be a window of block consecutive "
                  "tokens."),
               N_("take windows: data[s : s + block] for each random offset s"),
               edits=(("return torch.stack([data[s : s + block] for s in starts.tolist()])",
                       "return data[torch.randint(0, len(data), (batch, block), generator=generator)]"),)),
    ),
    correct=(Correct("unfold", edits=(("return torch.stack([data[s : s + block] for s in starts.tolist()])",
                                       "return data.unfold(0, block, 1)[starts]"),)),
             Correct("index_lists", edits=(("return torch.stack([data[s : s + block] for s in starts.tolist()])",
                                            "return data[starts[:, None] + torch.arange(block)[None, :]]"),))),
)

_LOSS = "ignore_index=-100 if pad_id is None else pad_id)"

LOSS = Family(
    task="ex08_loss", cell="ex08_loss_code", subject="next_char_loss",
    source=("def next_char_loss(logits: torch.Tensor, ids: torch.Tensor, pad_id: int | None = None) -> torch.Tensor:\n"
            "    pred = logits[:, :-1]\n"
            "    target = ids[:, 1:]\n"
            "    return torch.nn.functional.cross_entropy(pred.reshape(-1, pred.size(-1)), target.reshape(-1),\n"
            f"                                             {_LOSS}\n"),
    mutants=(
        Mutant("unshifted", Pitfall.UNSHIFTED_TARGETS, N_("next_char_loss: targets not shifted"),
               N_("your loss compares the logits at position t with token t itself: the model is taught to copy its input."),
               N_("logits[:, :-1] vs ids[:, 1:]: position t predicts token t + 1"),
               edits=(("pred = logits[:, :-1]", "pred = logits"), ("target = ids[:, 1:]", "target = ids"))),
        Mutant("shifted_backwards", Pitfall.UNSHIFTED_TARGETS, N_("next_char_loss shifts the wrong way"),
               N_("your loss compares the logits at position t + 1 with token t: each position predicts the token before it."),
               N_("logits[:, :-1] vs ids[:, 1:]: position t predicts token t + 1"),
               edits=(("pred = logits[:, :-1]", "pred = logits[:, 1:]"), ("target = ids[:, 1:]", "target = ids[:, :-1]"))),
        Mutant("pad_ignored", Pitfall.PADDING_IN_LOSS, N_("next_char_loss counts the padding"),
               N_("your loss with pad_id = 0 equals the loss without it: the padded targets are scored like real tokens."),
               N_("pass ignore_index=pad_id to cross_entropy when pad_id is given"), edits=((_LOSS, "ignore_index=-100)"),)),
        Mutant("pad_in_denominator", Pitfall.PADDING_IN_LOSS, N_("next_char_loss divides by the padding too"),
               N_("your padded targets add 0 to the loss but still count in the mean: the loss is the right sum divided by every "
                  "position, padding included."),
               N_("let cross_entropy average over the real tokens only: ignore_index=pad_id with the default reduction"),
               edits=((_LOSS, 'ignore_index=-100 if pad_id is None else pad_id, reduction="none").mean()'),)),
        Mutant("summed", Pitfall.GENERAL, N_("next_char_loss sums instead of averaging"),
               N_("your loss is the sum over the targets, not their mean: it is exactly the number of real targets times too "
                  "large."),
               N_("keep cross_entropy's default mean reduction"),
               edits=((_LOSS, 'ignore_index=-100 if pad_id is None else pad_id, reduction="sum")'),)),
        Mutant("detached", Pitfall.GENERAL, N_("next_char_loss returns a number, not a tensor"),
               N_("your loss is a Python float (.item()): it is detached from the graph, so loss.backward() cannot train."),
               N_("return the cross_entropy tensor itself, without .item()"),
               edits=((_LOSS, "ignore_index=-100 if pad_id is None else pad_id).item()"),)),
    ),
    correct=(Correct("log_softmax", edits=(("return torch.nn.functional.cross_entropy(", "return torch.nn.functional.nll_loss("),
                                           ("pred.reshape(-1, pred.size(-1)),", "pred.reshape(-1, pred.size(-1)).log_softmax(-1),"))),
             Correct("flatten", edits=(("pred.reshape(-1, pred.size(-1)), target.reshape(-1)",
                                        "pred.flatten(0, 1), target.flatten()"),))),
)

_COSINE = "return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * p))"

LR = Family(
    task="ex08_lr", cell="ex08_lr_code", subject="cosine_lr",
    source=("def cosine_lr(step: int, *, max_lr: float, min_lr: float, warmup: int, total: int) -> float:\n"
            "    if step < warmup:\n"
            "        return max_lr * (step + 1) / warmup\n"
            "    if step >= total:\n"
            "        return min_lr\n"
            "    p = (step - warmup) / max(1, total - warmup)\n"
            f"    {_COSINE}\n"),
    mutants=(
        Mutant("warmup_from_zero", Pitfall.GENERAL, N_("the warm-up starts at zero"),
               N_("your rate at step s < warmup is max_lr · s / warmup: 0 at step 0, one step behind the schedule all through "
                  "the warm-up."),
               N_("warm up as max_lr * (step + 1) / warmup: step 0 already trains"),
               edits=(("max_lr * (step + 1) / warmup", "max_lr * step / warmup"),)),
        Mutant("no_floor", Pitfall.GENERAL, N_("the schedule does not end at min_lr"),
               N_("your rate after step total keeps following the cosine, which rises again; it must stay at min_lr."),
               N_("return min_lr for every step >= total"), edits=(("if step >= total:\n        return min_lr\n", ""),)),
        Mutant("decays_to_zero", Pitfall.GENERAL, N_("the cosine decays to 0, not to min_lr"),
               N_("your cosine runs from max_lr down to 0 (0.5 · max_lr · (1 + cos)), then jumps to min_lr at step total."),
               N_("decay from max_lr to min_lr: min_lr + 0.5 * (max_lr - min_lr) * (1 + cos(pi * p))"),
               edits=((_COSINE, "return 0.5 * max_lr * (1 + math.cos(math.pi * p))"),)),
        Mutant("progress_from_zero", Pitfall.GENERAL, N_("the cosine counts from step 0"),
               N_("your cosine's progress is step / total, not (step - warmup) / (total - warmup): after the warm-up it starts "
                  "part of the way down."),
               N_("measure the progress after the warm-up: p = (step - warmup) / (total - warmup)"),
               edits=(("p = (step - warmup) / max(1, total - warmup)", "p = step / total"),)),
        Mutant("linear", Pitfall.GENERAL, N_("the decay is linear, not cosine"),
               N_("your rate falls in a straight line from max_lr to min_lr; the schedule follows half a cosine."),
               N_("decay as min_lr + 0.5 * (max_lr - min_lr) * (1 + cos(pi * p))"),
               edits=((_COSINE, "return min_lr + (max_lr - min_lr) * (1 - p)"),)),
        Mutant("warmup_one_long", Pitfall.GENERAL, N_("the warm-up lasts one step too long"),
               N_("your warm-up also covers step warmup (step <= warmup): that step gets max_lr · (warmup + 1) / warmup, above "
                  "max_lr."),
               N_("warm up while step < warmup"), edits=(("if step < warmup:", "if step <= warmup:"),)),
    ),
    correct=(Correct("clamped", edits=(("p = (step - warmup) / max(1, total - warmup)",
                                        "p = min(1.0, max(0.0, (step - warmup) / max(1, total - warmup)))"),)),
             Correct("cos_squared", edits=((_COSINE, "return min_lr + (max_lr - min_lr) * math.cos(math.pi * p / 2) ** 2"),))),
)


def _train_signature(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    """A short fresh run of the student's train on tinytf's parts (the probe's), its report without the wall-clock
    numbers: the notebook's own run is the student's, so only a fresh run compares."""
    from .. import swapped
    from ..ex08_probes import reduced_run, reference_parts

    with swapped(ns, **reference_parts()):
        report, inputs = reduced_run(ns, gen, learnable=False)
    return {k: v for k, v in report.items() if k != "tokens_per_s"}, inputs


_STEP = '        optimizer.step()\n        lrs.append(optimizer.param_groups[0]["lr"])\n        scheduler.step()\n'

TRAIN = Family(
    task="ex08_train", cell="ex08_train_code", subject="train",
    source=("def train(model: tinytf.TinyLanguageModel, train_data: torch.Tensor, val_data: torch.Tensor, *, steps: int, block: int, "
            "batch: int,\n"
            "          max_lr: float, min_lr: float, warmup: int, generator: torch.Generator\n"
            "          ) -> tuple[dict, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:\n"
            "    dev = next(model.parameters()).device\n"
            "    optimizer = torch.optim.AdamW(model.parameters(), lr=max_lr, weight_decay=0.01)\n"
            "    scheduler = torch.optim.lr_scheduler.LambdaLR(\n"
            "        optimizer, lambda s: cosine_lr(s, max_lr=max_lr, min_lr=min_lr, warmup=warmup, total=steps) / max_lr)\n"
            "    lrs, losses = [], []\n"
            "    model.train()\n"
            "    tinytf.synchronize(dev)\n"
            "    start = time.perf_counter()\n"
            "    for _ in tqdm(range(steps), desc=\"training\", leave=False):\n"
            "        ids = get_batch(train_data, block, batch, generator).to(dev)\n"
            "        loss = next_char_loss(model(ids), ids)\n"
            "        optimizer.zero_grad(set_to_none=True)\n"
            "        loss.backward()\n"
            "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            f"{_STEP}"
            "        losses.append(float(loss.detach()))\n"
            "    tinytf.synchronize(dev)\n"
            "    seconds = time.perf_counter() - start\n"
            "    memory = training_memory(model, optimizer, ids, next_char_loss)\n"
            "    report = {\"val_loss\": evaluate(model, val_data, block), \"train_loss\": sum(losses[-10:]) / len(losses[-10:]),\n"
            "              \"tokens_per_s\": steps * batch * block / seconds, \"seconds\": seconds, \"memory\": memory,\n"
            "              \"peak_memory_bytes\": memory[\"total\"], \"lrs\": lrs, \"losses\": losses,\n"
            "              \"conditions\": {\"device\": str(dev), "
            "\"dtype\": str(next(model.parameters()).dtype).removeprefix(\"torch.\"),\n"
            "                             \"batch\": batch, \"block\": block, \"steps\": steps}}\n"
            "    return report, optimizer, scheduler\n"),
    mutants=(
        Mutant("scheduler_first", Pitfall.GENERAL, N_("train steps the scheduler before the optimizer"),
               N_("your recorded rates are one step ahead of cosine_lr: scheduler.step() runs before optimizer.step(), so step s "
                  "trains with the rate of step s + 1."),
               N_("call optimizer.step(), then scheduler.step(), once per step"),
               edits=((_STEP, '        scheduler.step()\n        optimizer.step()\n'
                              '        lrs.append(optimizer.param_groups[0]["lr"])\n'),)),
        Mutant("scheduler_never_steps", Pitfall.GENERAL, N_("train never steps the scheduler"),
               N_("your rate stays at the first step's value: scheduler.step() is never called."),
               N_("call scheduler.step() after each optimizer.step()"),
               edits=((_STEP, '        optimizer.step()\n        lrs.append(optimizer.param_groups[0]["lr"])\n'),)),
        Mutant("val_on_train", Pitfall.GENERAL, N_("train reports the training data's loss as val_loss"),
               N_("your val_loss is evaluate(model, train_data, block): the held-out data is never evaluated."),
               N_("val_loss = evaluate(model, val_data, block)"),
               edits=(("evaluate(model, val_data, block)", "evaluate(model, train_data, block)"),)),
        Mutant("peak_not_total", Pitfall.GENERAL, N_("train reports the step's peak as the peak memory"),
               N_("your peak_memory_bytes is the step's peak alone; the ledger's total adds the parameters and the optimizer "
                  "state."),
               N_("peak_memory_bytes = memory['total']"),
               edits=(('"peak_memory_bytes": memory["total"]', '"peak_memory_bytes": memory["step_peak"]'),)),
        Mutant("lr_read_late", Pitfall.GENERAL, N_("train records the next step's learning rate"),
               N_("your recorded rates are one step ahead of cosine_lr while the training itself is right: the rate is read "
                  "after scheduler.step()."),
               N_("record optimizer.param_groups[0]['lr'] before scheduler.step()"),
               edits=((_STEP, '        optimizer.step()\n        scheduler.step()\n'
                              '        lrs.append(optimizer.param_groups[0]["lr"])\n'),)),
        Mutant("val_before_training", Pitfall.GENERAL, N_("train evaluates before training"),
               N_("your val_loss is the untrained model's: evaluate runs before the loop, not on the trained model."),
               N_("evaluate after the loop: val_loss = evaluate(model, val_data, block)"),
               edits=(("    dev = next(model.parameters()).device\n",
                       "    dev = next(model.parameters()).device\n    val_loss = evaluate(model, val_data, block)\n"),
                      ('"val_loss": evaluate(model, val_data, block)', '"val_loss": val_loss'))),
    ),
    correct=(Correct("item", edits=(("losses.append(float(loss.detach()))", "losses.append(loss.item())"),)),
             Correct("lr_from_scheduler", edits=(('lrs.append(optimizer.param_groups[0]["lr"])',
                                                  "lrs.append(scheduler.get_last_lr()[0])"),))),
    signature=_train_signature,
    reruns=("ex08_c20", "ex08_c24"),
    affects=("ex08_ckpt",),
)

_LOAD = "return ckpt.model.to(device).eval(), ckpt"

CKPT = Family(
    task="ex08_ckpt", cell="ex08_ckpt_code", subject="load_checkpoint",
    source=("def save_checkpoint(path: str | Path, model: tinytf.TinyLanguageModel, optimizer: torch.optim.Optimizer,\n"
            "                    scheduler: torch.optim.lr_scheduler.LRScheduler, step: int) -> None:\n"
            "    tinytf.save_checkpoint(path, model, optimizer, scheduler, step=step)\n"
            "\n"
            "\n"
            "def load_checkpoint(path: str | Path, device: str | torch.device = \"cpu\") -> tuple[tinytf.TinyLanguageModel, "
            "tinytf.Checkpoint]:\n"
            "    ckpt = tinytf.load_checkpoint(path, map_location=device)\n"
            f"    {_LOAD}\n"),
    mutants=(
        Mutant("train_mode", Pitfall.TRAIN_EVAL, N_("the restored model is in training mode"),
               N_("your load_checkpoint returns the rebuilt model as it comes, in training mode: dropout would stay on."),
               N_("call model.eval() on the restored model before returning it"), edits=((_LOAD, "return ckpt.model.to(device), ckpt"),)),
        Mutant("step_zero", Pitfall.GENERAL, N_("the checkpoint stores the wrong step"),
               N_("your checkpoint stores step 0 whatever step it is given."),
               N_("pass step on: tinytf.save_checkpoint(path, model, optimizer, scheduler, step=step)"),
               edits=(("step=step)", "step=0)"),)),
        Mutant("no_optimizer", Pitfall.GENERAL, N_("the checkpoint is incomplete"),
               N_("your checkpoint leaves out the optimizer (None was passed): training could not resume with AdamW's state."),
               N_("pass the optimizer and the scheduler to tinytf.save_checkpoint"),
               edits=(("save_checkpoint(path, model, optimizer, scheduler,", "save_checkpoint(path, model, None, scheduler,"),)),
        Mutant("fresh_model", Pitfall.GENERAL, N_("the restored model gives different outputs"),
               N_("your load_checkpoint returns a new model built from the saved config without the saved weights."),
               N_("return the checkpoint's restored model: ckpt.model"),
               edits=((_LOAD, "return tinytf.TinyLanguageModel(ckpt.config).to(device).eval(), ckpt"),)),
        Mutant("weights_only_file", Pitfall.GENERAL, N_("the checkpoint holds the weights only"),
               N_("your save_checkpoint writes model.state_dict() alone: no config, optimizer, scheduler or step, so "
                  "tinytf.load_checkpoint cannot read it."),
               N_("write everything with tinytf.save_checkpoint(path, model, optimizer, scheduler, step=step)"),
               edits=(("    tinytf.save_checkpoint(path, model, optimizer, scheduler, step=step)",
                       "    torch.save(model.state_dict(), path)"),)),
    ),
    correct=(Correct("eval_after", edits=((_LOAD, "model = ckpt.model.to(device)\n    model.eval()\n    return model, ckpt"),)),
             Correct("keyword_args", edits=(("tinytf.save_checkpoint(path, model, optimizer, scheduler, step=step)",
                                             "tinytf.save_checkpoint(path, model, optimizer=optimizer, scheduler=scheduler, "
                                             "step=step)"),))),
    reruns=("ex08_c24",),
)

FAMILIES = (VOCAB, BATCH, LOSS, LR, TRAIN, CKPT)
