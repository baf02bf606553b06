"""Judges and self-check diagnoses of exercises 5-8.

The instructor notebooks' own code is executed here (their solution and helper cells), their test
cells run with recording on, and every record must satisfy its judge in this process; wrong answers
(computed by deliberately buggy functions on the recorded inputs) must be rejected; ``diagnose``
must stay silent on the solutions and name the pitfall on buggy student functions.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import _runner as R
import nbformat
import pytest
import torch

import tinytf
from tinytf.checks import Pitfall
from tinytf.course.reference import ex05, ex06, ex07, ex08, ex08_probes
from tinytf.course.reference.judging import JUDGES, load_all

NOTEBOOKS = {
    "ex05": "ex05_cross_attention.ipynb",
    "ex06": "ex06_explicit_vs_sdpa.ipynb",
    "ex07": "ex07_kv_cache.ipynb",
    "ex08": "ex08_char_lm.ipynb",
}


def _cells(ex: str) -> dict[str, nbformat.NotebookNode]:
    return R.instructor_cells(NOTEBOOKS[ex])


def _namespace(ex: str, *grade_ids: str) -> dict:
    """Execute the named cells of the instructor notebook (setup first) in a fresh namespace."""
    return R.run_cells(_cells(ex), (f"{ex}_setup", *grade_ids))


def _pitfalls(findings) -> list[Pitfall]:
    return [f.pitfall for f in findings]


# ---- the notebooks' grading metadata ------------------------------------------------------------


@pytest.mark.parametrize("ex", sorted(NOTEBOOKS))
def test_every_grade_cell_has_a_judge_and_records_once(ex):
    load_all()
    cells = _cells(ex)
    tests = [c for c in cells.values() if c.metadata["nbgrader"].get("grade") and c.cell_type == "code"]
    assert tests
    for cell in tests:
        gid = cell.metadata["nbgrader"]["grade_id"]
        assert gid.startswith(f"{ex}_") and gid in JUDGES, gid
        hidden = R.hidden_part(cell)
        assert hidden.count("record(") == 1 and f'record("{gid}"' in hidden, gid
        assert "_g" in hidden and ".seed()" in hidden, f"{gid}: hidden inputs must be fresh random"
    points = sum(R.graded_points(cells).values())
    assert 10 <= points <= 20


def test_corpus_ships_with_the_package():
    from tinytf.data import CORPORA, load_corpus

    text = load_corpus()
    assert CORPORA == ("workshop_notes",) and len(text) > 4000 and text.isascii()
    assert 30 <= len(set(text)) <= 80
    with pytest.raises(ValueError, match="unknown corpus"):
        load_corpus("shakespeare")


# ---- exercise 5 ---------------------------------------------------------------------------------

EX05_CODE = ("ex05_attention_code", "ex05_load_helper", "ex05_cross_code", "ex05_model", "ex05_probe_code")
EX05_TESTS = ("ex05_attention", "ex05_cross", "ex05_encdec")


@pytest.fixture(scope="module")
def ex05_ns():
    return _namespace("ex05", *EX05_CODE)


def test_ex05_solution_passes_its_judges_and_wrong_answers_fail(ex05_ns, tmp_path):
    recs = R.record_tests(dict(ex05_ns), _cells("ex05"), EX05_TESTS, tmp_path)
    for gid, rec in recs.items():
        R.accepts(gid, rec["value"], rec["inputs"])

    inp = recs["ex05_attention"]["inputs"]
    q, k, v, mask = inp["q"], inp["k"], inp["v"], inp["mask"]
    unscaled = {"plain": tinytf.scaled_dot_product_attention(q, k, v, scale=1.0),
                "masked": tinytf.scaled_dot_product_attention(q, k, v, mask, scale=1.0)}
    R.rejects("ex05_attention", unscaled, inp)
    ignores_mask = {"plain": tinytf.scaled_dot_product_attention(q, k, v), "masked": tinytf.scaled_dot_product_attention(q, k, v)}
    if not bool(mask.all()):
        R.rejects("ex05_attention", ignores_mask, inp)

    inp = recs["ex05_cross"]["inputs"]
    good = recs["ex05_cross"]["value"]
    R.rejects("ex05_cross", {"plain": good["plain"], "masked": good["plain"] + 1e-2}, inp)
    R.rejects("ex05_cross", {"plain": torch.cat([good["plain"], good["plain"]], dim=1), "masked": good["masked"]}, inp)  # wrong Tq

    inp, value = recs["ex05_encdec"]["inputs"], recs["ex05_encdec"]["value"]
    blind = copy.deepcopy(value)
    blind["leaky"]["padding_leak"] = 0.0  # a probe that never notices the leak
    R.rejects("ex05_encdec", blind, inp)
    noisy = copy.deepcopy(value)
    noisy["good"]["padding_leak"] = noisy["good"]["encoder_effect"]  # a probe that changes the real positions too
    R.rejects("ex05_encdec", noisy, inp)


def test_ex05_diagnose_silent_on_solution_and_names_pitfalls(ex05_ns):
    assert ex05.diagnose(ex05_ns) == []

    ns = dict(ex05_ns)

    def unscaled(q, k, v, mask=None):
        scores = q @ k.transpose(-2, -1)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(-1) @ v

    ns["attention"] = unscaled
    assert Pitfall.SCALE in _pitfalls(ex05.diagnose(ns))

    ns = dict(ex05_ns)

    def stub(q, k, v, mask=None):
        raise NotImplementedError()

    ns["attention"] = stub
    titles = [f.title for f in ex05.diagnose(ns)]
    assert "attention is not implemented yet" in titles

    ns = dict(ex05_ns)

    class NoMask(ex05_ns["CrossAttention"]):
        def forward(self, x, context, mask=None):
            return super().forward(x, context, None)

    ns["CrossAttention"] = NoMask
    found = ex05.diagnose(ns)
    assert _pitfalls(found) == [Pitfall.MASK] and "mask" in found[0].title

    ns = dict(ex05_ns)

    def probe_everything(model, src, tgt, lengths):
        with torch.no_grad():
            base = model(src, tgt, lengths)
            d = (model(torch.randn_like(src), tgt, lengths) - base).abs().max()
        return {"encoder_effect": float(d), "padding_leak": float(d)}

    ns["probe_encoder_decoder"] = probe_everything
    leak = [f for f in ex05.diagnose(ns) if f.title == "the probe reports a leak on a correct model"]
    assert len(leak) == 1 and leak[0].pitfall is Pitfall.GENERAL, leak  # the model is right: a problem of the probe, no pitfall 3
    assert "PADDED positions" in leak[0].fix and "masked_fill" not in leak[0].message, leak
    del ns["probe_encoder_decoder"]
    assert any(f.title == "probe_encoder_decoder is missing" for f in ex05.diagnose(ns))


# ---- exercise 6 ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ex06_ns():
    ns = _namespace("ex06", "ex06_paths", "ex06_saved_code", "ex06_bench_code")
    ns["results"] = ns["benchmark_attention"]((256, 512, 1024), warmup=0, repeats=1)
    return ns


def test_ex06_solution_passes_its_judges_and_wrong_answers_fail(ex06_ns, tmp_path):
    recs = R.record_tests(dict(ex06_ns), _cells("ex06"), ("ex06_saved", "ex06_bench"), tmp_path)
    for gid, rec in recs.items():
        R.accepts(gid, rec["value"], rec["inputs"])

    inp, value = recs["ex06_saved"]["inputs"], recs["ex06_saved"]["value"]
    R.rejects("ex06_saved", {**value, "exp": value["exp"] // 4}, inp)  # elements, not bytes
    R.rejects("ex06_saved", {**value, "explicit": value["explicit"] + 4}, inp)
    R.rejects("ex06_saved", {**value, "sdpa": float(value["sdpa"])}, inp)  # not an int

    inp, value = recs["ex06_bench"]["inputs"], recs["ex06_bench"]["value"]
    flat = copy.deepcopy(value)
    for t in ("512", "1024"):
        flat["main"]["explicit"][t]["saved_bytes"] = flat["main"]["explicit"]["256"]["saved_bytes"]
    assert "4x" in R.rejects("ex06_bench", flat, inp)
    no_conditions = copy.deepcopy(value)
    del no_conditions["main"]["conditions"]["dtype"]
    R.rejects("ex06_bench", no_conditions, inp)
    wrong_fresh = copy.deepcopy(value)
    t0 = str(inp["ts"][0])
    wrong_fresh["fresh"]["explicit"][t0]["saved_bytes"] += 1
    R.rejects("ex06_bench", wrong_fresh, inp)
    negative = copy.deepcopy(value)
    negative["main"]["sdpa"]["512"]["tokens_per_s"] = float("nan")
    R.rejects("ex06_bench", negative, inp)
    missing_t = copy.deepcopy(value)
    del missing_t["main"]["sdpa"]["1024"]
    R.rejects("ex06_bench", missing_t, inp)


def test_ex06_diagnose(ex06_ns):
    assert ex06.diagnose(ex06_ns) == []

    def count_elements(fn, *args):
        total = 0

        def pack(t):
            nonlocal total
            total += t.numel()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(*args)
        return total

    found = ex06.diagnose({**ex06_ns, "saved_tensor_bytes": count_elements})
    assert any("elements, not bytes" in f.title for f in found)

    def stub(*args, **kwargs):
        raise NotImplementedError()

    titles = [f.title for f in ex06.diagnose({**ex06_ns, "saved_tensor_bytes": stub, "benchmark_attention": stub})]
    assert titles == ["saved_tensor_bytes is not implemented yet", "benchmark_attention is not implemented yet"]

    real = ex06_ns["benchmark_attention"]

    def no_conditions(*args, **kwargs):
        res = real(*args, **kwargs)
        res["conditions"] = {}
        return res

    assert Pitfall.COLD_TIMING in _pitfalls(ex06.diagnose({**ex06_ns, "benchmark_attention": no_conditions}))


# ---- exercise 7 ---------------------------------------------------------------------------------

EX07_TESTS = ("ex07_cache", "ex07_step", "ex07_generate")


@pytest.fixture(scope="module")
def ex07_ns():
    return _namespace("ex07", "ex07_cache_code", "ex07_step_code", "ex07_generate_code")


def test_ex07_solution_passes_its_judges_and_wrong_answers_fail(ex07_ns, tmp_path):
    recs = R.record_tests(dict(ex07_ns), _cells("ex07"), EX07_TESTS, tmp_path)
    for gid, rec in recs.items():
        R.accepts(gid, rec["value"], rec["inputs"])

    inp, value = recs["ex07_cache"]["inputs"], recs["ex07_cache"]["value"]
    only_new = {"returned": [{"k": w["k"], "v": w["v"]} for w in inp["writes"]], "lengths": value["lengths"]}
    if any(r["k"].shape != w["k"].shape for r, w in zip(value["returned"], inp["writes"])):
        R.rejects("ex07_cache", only_new, inp)
    R.rejects("ex07_cache", {**value, "lengths": [n + 1 for n in value["lengths"]]}, inp)

    inp = recs["ex07_step"]["inputs"]
    attn = ex07._attn(inp["x"], inp["heads"], inp["qkv_weight"], inp["qkv_bias"], inp["proj_weight"], inp["proj_bias"])
    with torch.no_grad():
        q, k, v = attn.project(inp["x"])
        no_mask = attn.proj(attn.merge_heads(tinytf.scaled_dot_product_attention(q, k, v)))  # a prefill that sees the future
    R.rejects("ex07_step", no_mask, inp)

    inp, value = recs["ex07_generate"]["inputs"], recs["ex07_generate"]["value"]
    R.rejects("ex07_generate", {**value, "logits": value["logits"] + 1e-2}, inp)
    R.rejects("ex07_generate", {**value, "ids_recompute": value["ids_recompute"][:, :-1]}, inp)


def test_ex07_diagnose(ex07_ns):
    assert ex07.diagnose(ex07_ns) == []
    base = ex07_ns["SimpleKVCache"]

    class OnlyNew(base):
        def update(self, layer, k_new, v_new):
            super().update(layer, k_new, v_new)
            return k_new, v_new

    class WrongAxis(base):
        def update(self, layer, k_new, v_new):
            if self.k[layer] is None:
                self.k[layer], self.v[layer] = k_new, v_new
            else:
                self.k[layer] = torch.cat([self.k[layer], k_new], dim=-1)
                self.v[layer] = torch.cat([self.v[layer], v_new], dim=-1)
            return self.k[layer], self.v[layer]

    assert _pitfalls(ex07.diagnose({**ex07_ns, "SimpleKVCache": OnlyNew})) == [Pitfall.KV_CACHE]
    assert _pitfalls(ex07.diagnose({**ex07_ns, "SimpleKVCache": WrongAxis})) == [Pitfall.ORIENTATION]

    import math as _m

    def step(attn, x_new, cache, layer=0, aligned="end"):
        b, t, dim = x_new.shape
        q, k, v = (z.view(b, t, attn.heads, attn.head_dim).transpose(1, 2) for z in attn.qkv(x_new).chunk(3, dim=-1))
        k_all, v_all = cache.update(layer, k, v)
        scores = q @ k_all.transpose(-2, -1) / _m.sqrt(attn.head_dim)
        if aligned == "end":
            scores = scores.masked_fill(~tinytf.causal_mask(t, k_all.size(2)), float("-inf"))
        elif aligned == "start":
            scores = scores.masked_fill(torch.ones(t, k_all.size(2), dtype=torch.bool).triu(1), float("-inf"))
        return attn.proj((scores.softmax(-1) @ v_all).transpose(1, 2).reshape(b, t, dim))

    assert ex07.diagnose({**ex07_ns, "attention_step": step}) == []
    no_mask = ex07.diagnose({**ex07_ns, "attention_step": lambda *a: step(*a, aligned="none")})
    assert _pitfalls(no_mask) == [Pitfall.CAUSAL_OFF_BY_ONE] and "no causal mask" in no_mask[0].title
    start = ex07.diagnose({**ex07_ns, "attention_step": lambda *a: step(*a, aligned="start")})
    assert _pitfalls(start) == [Pitfall.CAUSAL_OFF_BY_ONE] and "END-aligned" in start[0].message

    @torch.no_grad()
    def whole_prefix(model, prompt, cache):
        logits1 = model(prompt, cache=cache)[:, -1]
        tok1 = logits1.argmax(-1, keepdim=True)
        ids = torch.cat([prompt, tok1], 1)
        logits2 = model(ids, cache=cache)[:, -1]
        return torch.cat([ids, logits2.argmax(-1, keepdim=True)], 1), torch.stack([logits1, logits2], 1)

    found = ex07.diagnose({**ex07_ns, "generate_two_step": whole_prefix})
    assert _pitfalls(found) == [Pitfall.KV_CACHE]


# ---- exercise 8 ---------------------------------------------------------------------------------

EX08_CODE = ("ex08_vocab_code", "ex08_batch_code", "ex08_loss_code", "ex08_lr_code", "ex08_helpers", "ex08_train_code", "ex08_ckpt_code")


@pytest.fixture(scope="module")
def ex08_ns():
    return _namespace("ex08", *EX08_CODE)


def test_ex08_small_parts_pass_their_judges_and_wrong_answers_fail(ex08_ns, tmp_path):
    recs = R.record_tests(dict(ex08_ns), _cells("ex08"), ("ex08_vocab", "ex08_batch", "ex08_loss", "ex08_lr"), tmp_path)
    for gid, rec in recs.items():
        R.accepts(gid, rec["value"], rec["inputs"])

    inp, value = recs["ex08_vocab"]["inputs"], recs["ex08_vocab"]["value"]
    R.rejects("ex08_vocab", {**value, "itos": list(dict.fromkeys(inp["text"]))} if list(dict.fromkeys(inp["text"])) != value["itos"]
             else {**value, "decoded": value["decoded"][::-1] + "x"}, inp)
    R.rejects("ex08_vocab", {**value, "ids": value["ids"].float()}, inp)

    inp, value = recs["ex08_batch"]["inputs"], recs["ex08_batch"]["value"]
    shuffled = value["rows"].clone()
    shuffled[0] = value["rows"][0].flip(0) + 1000  # not a window of the data (data values are < 1000)
    R.rejects("ex08_batch", {**value, "rows": shuffled}, inp)
    never_last = torch.stack([inp["edge"][: inp["block"]]] * value["edge"].size(0))  # every row starts at offset 0
    R.rejects("ex08_batch", {**value, "edge": never_last}, inp, "last offset")

    inp = recs["ex08_loss"]["inputs"]
    lg, ids, pids = inp["logits"], inp["ids"], inp["padded_ids"]
    ce = torch.nn.functional.cross_entropy
    unshifted = {"plain": ce(lg.reshape(-1, lg.size(-1)), ids.reshape(-1)), "padded": ce(lg.reshape(-1, lg.size(-1)), pids.reshape(-1))}
    R.rejects("ex08_loss", unshifted, inp)
    pad_counted = {"plain": tinytf.lm_loss(lg, ids), "padded": tinytf.lm_loss(lg, pids)}
    if bool((pids[:, 1:] == 0).any()):
        R.rejects("ex08_loss", pad_counted, inp)

    inp, value = recs["ex08_lr"]["inputs"], recs["ex08_lr"]["value"]
    R.rejects("ex08_lr", [value[0] * 0] + value[1:], inp)
    R.rejects("ex08_lr", value[:-1], inp)


def _periodic_run(ns, steps=60):
    """Train a tiny model with the solution's train() on a periodic sequence (learnable in a second)."""
    torch.manual_seed(0)
    data = torch.tensor([0, 1, 2, 3, 2, 1] * 60)
    model = tinytf.TinyLanguageModel(vocab=4, dim=16, heads=2, layers=1, max_tokens=12)
    schedule = {"steps": steps, "block": 12, "batch": 8, "max_lr": 1e-2, "min_lr": 1e-3, "warmup": 5}
    report, opt, sched = ns["train"](model, data[:300], data[300:], generator=torch.Generator().manual_seed(0), **schedule)
    keep = ("val_loss", "train_loss", "tokens_per_s", "peak_memory_bytes", "memory", "lrs", "losses")
    return {k: report[k] for k in keep}, model, schedule, data[300:], opt, sched


def test_ex08_train_judge_accepts_a_real_run_and_rejects_inconsistent_reports(ex08_ns):
    rep, model, schedule, val, _, _ = _periodic_run(ex08_ns)
    assert rep["val_loss"] < math.log(4) - ex08.MARGIN
    inputs = {"config": model.config.to_dict(), "schedule": schedule, "state_dict": dict(model.state_dict()), "val_data": val,
              "fresh_config": model.config.to_dict(), "fresh_schedule": schedule, "fresh_state_dict": dict(model.state_dict()),
              "fresh_val_data": val}
    value = {"main": rep, "fresh": copy.deepcopy(rep)}
    R.accepts("ex08_train", value, inputs)

    assert "val_loss" in R.rejects("ex08_train", {**value, "main": {**rep, "val_loss": rep["val_loss"] - 0.5}}, inputs)
    lrs = list(rep["lrs"])
    lrs[0] = schedule["max_lr"]  # no warm-up
    assert "schedule" in R.rejects("ex08_train", {**value, "fresh": {**rep, "lrs": lrs}}, inputs)
    assert "peak" in R.rejects("ex08_train", {**value, "main": {**rep, "peak_memory_bytes": rep["peak_memory_bytes"] + 1}}, inputs)
    R.rejects("ex08_train", {**value, "main": {**rep, "tokens_per_s": float("inf")}}, inputs)

    untrained = tinytf.TinyLanguageModel(vocab=4, dim=16, heads=2, layers=1, max_tokens=12)
    bad_inputs = {**inputs, "state_dict": dict(untrained.state_dict())}
    rep_u = {**rep, "val_loss": ex08.reference_evaluate(untrained, val, 12)}
    rep_u["memory"] = dict(rep["memory"])
    assert "below log(vocab)" in R.rejects("ex08_train", {**value, "main": rep_u}, bad_inputs)


def test_ex08_checkpoint_judge(ex08_ns, tmp_path):
    torch.manual_seed(1)
    model = tinytf.TinyLanguageModel(vocab=9, dim=8, heads=2, layers=1, max_tokens=6).eval()
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    ex08_ns["save_checkpoint"](tmp_path / "c.pt", model, opt, sched, 7)
    restored, _ = ex08_ns["load_checkpoint"](tmp_path / "c.pt", "cpu")
    raw = torch.load(tmp_path / "c.pt", weights_only=True)  # the hidden test records the file's own keys and step
    ids = torch.randint(0, 9, (2, 6))
    with torch.no_grad():
        value = {"logits": restored(ids), "keys": sorted(raw), "step": raw["step"], "training": bool(restored.training)}
    inputs = {"ids": ids, "config": model.config.to_dict(), "state_dict": dict(model.state_dict())}
    R.accepts("ex08_ckpt", value, inputs)
    R.rejects("ex08_ckpt", {**value, "training": True}, inputs)
    R.rejects("ex08_ckpt", {**value, "keys": ["config", "model", "step"]}, inputs)
    R.rejects("ex08_ckpt", {**value, "step": None}, inputs)
    R.rejects("ex08_ckpt", {**value, "logits": value["logits"] + 1e-3}, inputs)
    fresh = tinytf.TinyLanguageModel(vocab=9, dim=8, heads=2, layers=1, max_tokens=6).eval()
    with torch.no_grad():
        R.rejects("ex08_ckpt", {**value, "logits": fresh(ids)}, inputs)  # a model that was not restored


def test_ex08_diagnose(ex08_ns):
    assert ex08.diagnose(ex08_ns) == []

    def unshifted(logits, ids, pad_id=None):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), ids.reshape(-1),
                                                 ignore_index=-100 if pad_id is None else pad_id)

    def counts_pad(logits, ids, pad_id=None):
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))

    assert Pitfall.UNSHIFTED_TARGETS in _pitfalls(ex08.diagnose({**ex08_ns, "next_char_loss": unshifted}))
    assert Pitfall.PADDING_IN_LOSS in _pitfalls(ex08.diagnose({**ex08_ns, "next_char_loss": counts_pad}))

    def stub(*args, **kwargs):
        raise NotImplementedError()

    titles = [f.title for f in ex08.diagnose({**ex08_ns, "next_char_loss": stub, "cosine_lr": stub})]
    assert "next_char_loss is not implemented yet" in titles and "cosine_lr is not implemented yet" in titles

    def zero_warmup(step, *, max_lr, min_lr, warmup, total):
        if step < warmup:
            return max_lr * step / warmup
        return ex08.reference_cosine_lr(step, max_lr=max_lr, min_lr=min_lr, warmup=warmup, total=total)

    assert [f.title for f in ex08.diagnose({**ex08_ns, "cosine_lr": zero_warmup})] == ["the warm-up starts at zero"]

    load = ex08_ns["load_checkpoint"]

    def load_train_mode(path, device="cpu"):
        model, ckpt = load(path, device)
        return model.train(), ckpt

    assert Pitfall.TRAIN_EVAL in _pitfalls(ex08.diagnose({**ex08_ns, "load_checkpoint": load_train_mode}))

    def save_weights_only(path, model, optimizer, scheduler, step):
        tinytf.save_checkpoint(path, model, step=step)  # forgets the optimizer and the scheduler

    def save_a_path(path, model, optimizer, scheduler, step):  # a pickled object that weights_only=True refuses
        torch.save({"config": model.config.to_dict(), "model": model.state_dict(), "step": step, "where": Path(path)}, path)

    titles = [f.title for f in ex08.diagnose({**ex08_ns, "save_checkpoint": save_weights_only})]
    assert titles == ["the checkpoint is incomplete"]
    assert "scheduler" in ex08.diagnose({**ex08_ns, "save_checkpoint": save_weights_only})[0].message
    titles = [f.title for f in ex08.diagnose({**ex08_ns, "save_checkpoint": save_a_path})]
    assert titles == ["the checkpoint cannot be read with torch.load(weights_only=True)"]

    def unsorted_vocab(text):
        itos = list(dict.fromkeys(text))
        return {c: i for i, c in enumerate(itos)}, itos

    assert [f.title for f in ex08.diagnose({**ex08_ns, "build_vocab": unsorted_vocab})] == ["itos is not the sorted distinct characters"]


def test_ex08_train_is_judged_on_tinytfs_parts_when_an_earlier_part_is_wrong(ex08_ns):
    """Part E on its own (issue 12, point 4): with a wrong next_char_loss the self-check still judges
    train, on tinytf's loss as the graded cell does, and says so when train itself is wrong."""
    def unshifted(logits, ids, pad_id=None):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), ids.reshape(-1),
                                                 ignore_index=-100 if pad_id is None else pad_id)

    cells = _cells("ex08")
    source = cells["ex08_train_code"].source
    ns = R.run_cells(cells, ["ex08_train_code"], {**ex08_ns, "next_char_loss": unshifted})  # train's globals: the wrong loss
    value, inputs = ex08_probes.PROBES["ex08_train"](ns, torch.Generator().manual_seed(0))
    R.accepts("ex08_train", value, inputs)
    assert ns["next_char_loss"] is unshifted, "the student's function is back after the probe"
    findings = ex08.diagnose(ns)
    assert Pitfall.UNSHIFTED_TARGETS in _pitfalls(findings) and not [f for f in findings if "ex08_train" in f.title]

    assert source.count("scheduler.step()") == 1
    R.run_cells(cells, ["ex08_train_code"], ns, sources={"ex08_train_code": source.replace("scheduler.step()", "pass")})  # no schedule
    # train's own mistake is named by its mutant (issue 35), matched on a fresh run on tinytf's parts
    [train] = [f for f in ex08.diagnose(ns) if f.title == "train never steps the scheduler"]
    assert "scheduler.step() is never called" in train.message and train.fix == "call scheduler.step() after each optimizer.step()"
    # a mistake of train no mutant knows is judged on tinytf's parts too, and the judge's message says so
    other = source.replace("scheduler.step()", "pass").replace('"val_loss": evaluate(model, val_data, block)', '"val_loss": 1e-3')
    R.run_cells(cells, ["ex08_train_code"], ns, sources={"ex08_train_code": other})
    [train] = [f for f in ex08.diagnose(ns) if f.title == "train: a mistake none of the known ones explains"]
    assert "the learning rate at step" in train.message or "val_loss" in train.message, train.message
    assert not train.fix.startswith("call scheduler"), "no fix that belongs to another mistake"
    assert "train was judged with tinytf's `next_char_loss`, because yours above is wrong" in train.message, train.message
