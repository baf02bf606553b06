"""save_checkpoint / load_checkpoint: the whole architecture travels with the weights, and a bad file
never half-loads."""

from __future__ import annotations

import os
import struct
import zipfile

import pytest
import torch

import tinytf.checkpoint
from tinytf import ModelConfig, TinyLanguageModel, load_checkpoint, save_checkpoint, train_step


def _lr(step: int) -> float:
    return 1.0 / (1 + step)  # a schedule that visibly moves, so a lost scheduler state shows


def _run(cfg: ModelConfig, seed: int = 0):
    """A model, its AdamW and LambdaLR after two training steps, and the batch they trained on."""
    torch.manual_seed(seed)
    model = TinyLanguageModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr)
    ids = torch.randint(0, cfg.vocab, (3, cfg.max_tokens), generator=torch.Generator().manual_seed(seed + 1))
    for _ in range(2):
        train_step(model, opt, ids, scheduler=sched)
    return model, opt, sched, ids


def _snapshot(model, opt=None):
    params = {k: v.clone() for k, v in model.state_dict().items()}
    state = None if opt is None else repr(opt.state_dict())
    return params, state


def _unchanged(model, opt, snap) -> bool:
    params, state = snap
    same = all(torch.equal(v, params[k]) for k, v in model.state_dict().items())
    return same and (opt is None or repr(opt.state_dict()) == state)


CFG = ModelConfig(vocab=11, dim=16, heads=2, layers=2, max_tokens=8)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("backend", ["explicit", "sdpa", "tiled"])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_round_trip_gives_the_same_outputs_and_the_same_next_step(tmp_path, norm, backend, dropout, bias):
    cfg = ModelConfig(vocab=11, dim=16, heads=2, layers=2, max_tokens=8, norm=norm, dropout=dropout, backend=backend, bias=bias)
    if backend == "tiled" and dropout > 0:  # the config is valid (evaluation works), training is refused
        with pytest.raises(ValueError, match="backend='tiled' has no dropout"):
            _run(cfg)
        return
    model, opt, sched, ids = _run(cfg)
    path = save_checkpoint(tmp_path / "run.pt", model, opt, sched, step=2, note="copy task", seen=torch.arange(3))
    ckpt = load_checkpoint(path)
    restored = ckpt.model
    assert ckpt.config == cfg == restored.config and ckpt.step == 2
    assert ckpt.extra["note"] == "copy task" and torch.equal(ckpt.extra["seen"], torch.arange(3))
    assert restored.training, "a new model starts in training mode, like any new module"
    assert ("blocks.0.attn.qkv.bias" in restored.state_dict()) is bias

    model.eval(), restored.eval()
    with torch.no_grad():
        assert torch.equal(model(ids), restored(ids))

    r_opt = torch.optim.AdamW(restored.parameters(), lr=1e-2, weight_decay=0.01)
    r_sched = torch.optim.lr_scheduler.LambdaLR(r_opt, _lr)  # built before loading: its constructor resets the lr
    load_checkpoint(path, model=restored, optimizer=r_opt, scheduler=r_sched)
    fresh = TinyLanguageModel(cfg)
    fresh.load_state_dict(restored.state_dict())
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2, weight_decay=0.01)  # no saved moments: a different step
    for m, o, s in ((model, opt, sched), (restored, r_opt, r_sched), (fresh, fresh_opt, None)):
        torch.manual_seed(5)  # the same dropout masks in every run
        train_step(m, o, ids, scheduler=s)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), restored.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(model.parameters(), fresh.parameters()))
    assert r_sched.get_last_lr() == sched.get_last_lr() == [1e-2 * _lr(3)]


def test_file_is_plain_data_written_atomically(tmp_path):
    model, opt, sched, _ = _run(CFG)
    path = save_checkpoint(tmp_path / "sub" / "c.pt", model, opt, sched, step=2)
    raw = torch.load(path, weights_only=True)
    assert {"format", "version", "config", "model", "optimizer", "scheduler", "step", "extra"} == set(raw)
    assert raw["config"] == CFG.to_dict() and raw["step"] == 2
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert os.listdir(path.parent) == ["c.pt"]  # no temporary file left behind
    assert {"optimizer", "scheduler", "step"}.isdisjoint(torch.load(save_checkpoint(tmp_path / "w.pt", model), weights_only=True))
    assert load_checkpoint(tmp_path / "w.pt").optimizer_state is None


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model, opt, _, _ = _run(CFG)
    path = save_checkpoint(tmp_path / "c.pt", model, step=1)
    before = path.read_bytes()

    def crash(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(tinytf.checkpoint.torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, model, opt, step=2)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["c.pt"]


def test_extra_values_must_be_plain(tmp_path):
    model = TinyLanguageModel(CFG)
    with pytest.raises(ValueError, match=r"extra itos=.*holds a object.*weights_only=True"):
        save_checkpoint(tmp_path / "c.pt", model, itos=["a", object()])
    with pytest.raises(ValueError, match=r"extra where=.*PosixPath.*Path to str"):
        save_checkpoint(tmp_path / "c.pt", model, where=tmp_path)
    with pytest.raises(ValueError, match="step must be a non-negative int"):
        save_checkpoint(tmp_path / "c.pt", model, step=1.5)
    with pytest.raises(ValueError, match="needs a tinytf.TinyLanguageModel.*Linear"):
        save_checkpoint(tmp_path / "c.pt", torch.nn.Linear(2, 2))
    assert not any(tmp_path.iterdir())


def _data_offset(path, entry_suffix: str) -> int:
    """Byte offset of the stored data of the zip entry whose name ends with entry_suffix."""
    info = max((i for i in zipfile.ZipFile(path).infolist() if i.filename.endswith(entry_suffix)), key=lambda i: i.file_size)
    header = path.read_bytes()[info.header_offset : info.header_offset + 30]
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len


def _bad_files(tmp_path):
    model, opt, sched, _ = _run(CFG, seed=3)
    good = save_checkpoint(tmp_path / "good.pt", model, opt, sched, step=2)
    data = good.read_bytes()
    corrupt = bytearray(data)
    start = _data_offset(good, "/data/0")  # the stored bytes of a weight tensor
    corrupt[start : start + 8] = bytes(b ^ 0xFF for b in corrupt[start : start + 8])
    not_ours = tmp_path / "plain.pt"
    torch.save({"weights": model.state_dict()}, not_ours)
    files = {
        "truncated": (data[: len(data) // 2], "truncated"),
        "corrupted": (bytes(corrupt), "corrupted"),
        "text": (b"vocab,dim\n100,32\n", "not a readable checkpoint"),
        "empty": (b"", "not a readable checkpoint"),
        "plain": (not_ours.read_bytes(), "not a tinytf checkpoint"),
    }
    for name, (blob, _) in files.items():
        (tmp_path / f"{name}.pt").write_bytes(blob)
    return {name: (tmp_path / f"{name}.pt", message) for name, (_, message) in files.items()}


def test_a_bad_file_raises_a_clear_error_and_touches_nothing(tmp_path):
    cases = _bad_files(tmp_path)
    target, t_opt, _, _ = _run(CFG, seed=9)
    t_sched = torch.optim.lr_scheduler.LambdaLR(t_opt, _lr)
    snap = _snapshot(target, t_opt)
    for name, (path, message) in cases.items():
        for kwargs in ({}, {"model": target, "optimizer": t_opt, "scheduler": t_sched}):
            with pytest.raises(ValueError, match=message) as err:
                load_checkpoint(path, **kwargs)
            assert str(path) in str(err.value), name
        assert _unchanged(target, t_opt, snap), f"{name}: the target model or optimizer was modified"
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")


def test_a_config_mismatch_names_every_differing_field(tmp_path):
    post = TinyLanguageModel(CFG, norm="post", dropout=0.1)
    path = save_checkpoint(tmp_path / "post.pt", post)
    pre = TinyLanguageModel(CFG)
    pre.load_state_dict(post.state_dict(), strict=True)  # the trap: same names and shapes, no error
    pre = TinyLanguageModel(CFG)
    snap = _snapshot(pre)
    with pytest.raises(ValueError, match=r"norm: checkpoint 'post', model 'pre'; dropout: checkpoint 0.1, model 0.0") as err:
        load_checkpoint(path, model=pre)
    assert str(path) in str(err.value) and "backend" not in str(err.value)
    assert _unchanged(pre, None, snap)
    assert load_checkpoint(path).model.blocks[0].norm_position == "post"  # without model= it rebuilds what was saved


def test_an_optimizer_or_state_that_does_not_fit_touches_nothing(tmp_path):
    model, opt, _, _ = _run(CFG)
    path = save_checkpoint(tmp_path / "c.pt", model, opt, step=2)
    target = TinyLanguageModel(CFG)
    snap = _snapshot(target)
    only_head = torch.optim.AdamW([target.lm_head.weight])
    with pytest.raises(ValueError, match=r"parameter groups of sizes \[\d+\], yours has \[1\]"):
        load_checkpoint(path, model=target, optimizer=only_head)
    with pytest.raises(ValueError, match="holds no scheduler state"):
        load_checkpoint(path, model=target, scheduler=torch.optim.lr_scheduler.LambdaLR(torch.optim.AdamW(target.parameters()), _lr))
    raw = torch.load(path, weights_only=True)
    raw["model"]["lm_head.weight"] = raw["model"]["lm_head.weight"][:, :4]
    torch.save(raw, tmp_path / "edited.pt")
    with pytest.raises(ValueError, match=r"wrong shapes \['lm_head.weight: checkpoint \[11, 4\], model \[11, 16\]'\]"):
        load_checkpoint(tmp_path / "edited.pt", model=target)
    assert _unchanged(target, None, snap)


def test_old_checkpoints_load_with_the_defaults(tmp_path):
    model, opt, sched, ids = _run(CFG)
    old_config = {k: v for k, v in CFG.to_dict().items() if k in ("vocab", "dim", "heads", "layers", "max_tokens", "expansion")}
    torch.save({"config": old_config, "model": model.state_dict(), "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(), "step": 2}, tmp_path / "handwritten.pt")  # as chapter 07 used to
    ckpt = load_checkpoint(tmp_path / "handwritten.pt")
    assert ckpt.config == CFG and ckpt.step == 2 and ckpt.extra == {} and ckpt.optimizer_state is not None
    with torch.no_grad():
        assert torch.equal(ckpt.model.eval()(ids), model.eval()(ids))
    raw = torch.load(save_checkpoint(tmp_path / "new.pt", model), weights_only=True)
    torch.save({**raw, "config": old_config}, tmp_path / "v1_old_config.pt")
    assert load_checkpoint(tmp_path / "v1_old_config.pt").config == CFG


def test_files_from_a_newer_tinytf_are_refused_clearly(tmp_path):
    raw = torch.load(save_checkpoint(tmp_path / "c.pt", TinyLanguageModel(CFG)), weights_only=True)
    torch.save({**raw, "config": {**raw["config"], "moe_experts": 8}}, tmp_path / "field.pt")
    with pytest.raises(ValueError, match=r"field\.pt holds an invalid model config: unknown ModelConfig field\(s\) \['moe_experts'\]"):
        load_checkpoint(tmp_path / "field.pt")
    torch.save({**raw, "version": 99}, tmp_path / "version.pt")
    with pytest.raises(ValueError, match="format version 99.*upgrade tinytf"):
        load_checkpoint(tmp_path / "version.pt")


def test_a_scheduler_that_does_not_fit_touches_nothing(tmp_path):
    model, opt, sched, _ = _run(CFG)
    path = save_checkpoint(tmp_path / "c.pt", model, opt, sched, step=2)
    target = TinyLanguageModel(CFG)
    rest = [p for n, p in target.named_parameters() if not n.startswith("blocks")]
    groups = [{"params": list(target.blocks.parameters())}, {"params": rest}]
    t_opt = torch.optim.AdamW(groups)
    two = torch.optim.lr_scheduler.LambdaLR(t_opt, [_lr, _lr])
    snap = _snapshot(target, t_opt)
    with pytest.raises(ValueError, match="parameter groups of sizes"):
        load_checkpoint(path, model=target, optimizer=t_opt, scheduler=two)
    one_group = torch.optim.AdamW(target.parameters())
    with pytest.raises(ValueError, match="the saved scheduler has 1 base_lrs, yours has 2"):
        load_checkpoint(path, model=target, optimizer=one_group, scheduler=two)
    assert _unchanged(target, t_opt, snap)


def test_the_position_choice_travels_with_the_weights_and_old_files_load_as_learned(tmp_path):
    torch.manual_seed(9)
    cfg = ModelConfig(vocab=20, dim=16, heads=2, layers=1, max_tokens=8, positions="rope", rotary_dim=4, rope_layout="interleaved",
                      rope_scaling="yarn", rope_factor=2.0)
    model = TinyLanguageModel(cfg).eval()
    loaded = load_checkpoint(save_checkpoint(tmp_path / "rope.pt", model)).model.eval()
    ids = torch.randint(0, 20, (2, 12))  # past max_tokens: RoPE has no table
    assert loaded.config == cfg
    torch.testing.assert_close(loaded(ids), model(ids), atol=0, rtol=0)
    alibi = TinyLanguageModel(vocab=20, dim=16, heads=2, layers=1, max_tokens=8, positions="alibi")
    assert load_checkpoint(save_checkpoint(tmp_path / "alibi.pt", alibi)).config.positions == "alibi"
    old = TinyLanguageModel(vocab=20, dim=16, heads=2, layers=1, max_tokens=8)
    legacy = {k: v for k, v in old.config.to_dict().items() if k not in ("positions", "rope_base", "rotary_dim", "rope_layout",
                                                                         "rope_scaling", "rope_factor")}
    torch.save({"config": legacy, "model": old.state_dict()}, tmp_path / "old.pt")  # written before positions existed
    back = load_checkpoint(tmp_path / "old.pt")
    assert back.config.positions == "learned" and "position.weight" in back.model.state_dict()
    with pytest.raises(ValueError, match="positions: checkpoint 'rope', model 'learned'"):
        load_checkpoint(tmp_path / "rope.pt", model=TinyLanguageModel(vocab=20, dim=16, heads=2, layers=1, max_tokens=8))
