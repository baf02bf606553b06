"""TinyLanguageModel, lm_loss and train_step."""

import math

import pytest
import torch
import torch.nn.functional as F

from tinytf import ModelConfig, TinyLanguageModel, count_parameters, lm_loss, padding_mask, train_step
from tinytf.config import BACKENDS


def test_logits_shape_and_future_leak(device):
    model = TinyLanguageModel(vocab=50, dim=32, heads=4, layers=2, max_tokens=16).to(device)
    ids = torch.randint(0, 50, (3, 12), device=device)
    logits = model(ids)
    assert logits.shape == (3, 12, 50)
    ids2 = ids.clone()
    ids2[:, 7:] = torch.randint(0, 50, (3, 5), device=device)
    torch.testing.assert_close(model(ids2)[:, :7], logits[:, :7])


def test_edge_lengths_and_errors():
    model = TinyLanguageModel(max_tokens=8)
    assert model(torch.randint(0, 100, (1, 1))).shape == (1, 1, 100)
    assert model(torch.randint(0, 100, (1, 8))).shape == (1, 8, 100)
    with pytest.raises(ValueError, match=r"9 positions.*max_tokens=8"):
        model(torch.randint(0, 100, (1, 9)))
    with pytest.raises(ValueError, match=r"integer tensor \[B, T\]"):
        model(torch.randn(1, 4))


def test_parameter_count_computed():
    v, d, h, n, t = 100, 32, 4, 2, 64
    model = TinyLanguageModel(v, d, h, n, t)
    block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    assert count_parameters(model) == v * d + t * d + n * block + 2 * d + d * v


def test_lm_loss_shifts_and_matches_cross_entropy():
    logits = torch.randn(2, 6, 11)
    ids = torch.randint(0, 11, (2, 6))
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, 11), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(lm_loss(logits, ids), expected)
    # an unshifted loss is a different number
    assert not torch.allclose(lm_loss(logits, ids), F.cross_entropy(logits.reshape(-1, 11), ids.reshape(-1)))


def test_lm_loss_ignores_padding_in_sum_and_denominator():
    torch.manual_seed(2)
    pad = 0
    ids = torch.tensor([[5, 3, 7, 2, 0, 0], [4, 4, 1, 8, 9, 6]])
    logits = torch.randn(2, 6, 10)
    loss = lm_loss(logits, ids, pad_id=pad)
    per_token = F.cross_entropy(logits[:, :-1].reshape(-1, 10), ids[:, 1:].reshape(-1), reduction="none")
    real = ids[:, 1:].reshape(-1) != pad
    torch.testing.assert_close(loss, per_token[real].sum() / real.sum())
    # changing the logits at padded targets changes nothing
    logits2 = logits.clone()
    logits2[0, 3:5] += 100
    torch.testing.assert_close(lm_loss(logits2, ids, pad_id=pad), loss)


def test_lm_loss_errors():
    with pytest.raises(ValueError, match=r"logits \[2, 5, 7\].*ids \[2, 4\]"):
        lm_loss(torch.randn(2, 5, 7), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="pad_id"):
        lm_loss(torch.randn(1, 3, 7), torch.zeros(1, 3, dtype=torch.long), pad_id=0)


def test_initial_loss_near_log_vocab_and_training_reduces_it():
    torch.manual_seed(0)
    model = TinyLanguageModel(vocab=100, dim=32, heads=4, layers=2, max_tokens=16)
    ids = torch.randint(0, 100, (8, 16))
    with torch.no_grad():
        first = lm_loss(model(ids), ids).item()
    assert abs(first - math.log(100)) < 0.5
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    stats = [train_step(model, opt, ids) for _ in range(30)]
    assert stats[-1]["loss"] < first - 1.0  # memorising one batch
    assert all(s["grad_norm"] > 0 and s["lr"] == 3e-3 for s in stats)


def test_three_backends_agree_on_logits_loss_and_gradients(device):
    torch.manual_seed(0)
    ids = torch.randint(0, 60, (2, 80), device=device)  # 80 tokens: two query tiles of the tiled backend
    results = {}
    for backend in ("explicit", "sdpa", "tiled"):
        torch.manual_seed(1)  # the same weights for every backend
        model = TinyLanguageModel(vocab=60, dim=32, heads=4, layers=2, max_tokens=80, backend=backend).to(device)
        logits = model(ids)
        lm_loss(logits, ids).backward()
        results[backend] = [logits.detach()] + [p.grad for p in model.parameters()]
    for backend in ("sdpa", "tiled"):
        for a, b in zip(results[backend], results["explicit"]):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


# ---- ModelConfig: every architectural choice in one object -------------------------------------

CHOICES = {"norm": "post", "dropout": 0.1, "backend": "sdpa", "bias": False}


def test_config_holds_every_choice_and_the_blocks_follow_it():
    model = TinyLanguageModel(vocab=20, dim=16, heads=2, layers=2, max_tokens=8, expansion=2, **CHOICES)
    assert model.config == ModelConfig(20, 16, 2, 2, 8, 2, **CHOICES)
    for block in model.blocks:
        assert block.norm_position == "post" and block.attn.backend == "sdpa" and block.attn.dropout == 0.1
        assert block.drop.p == 0.1 and block.ffn[0].out_features == 32
        assert all(m.bias is None for m in (block.attn.qkv, block.attn.proj, block.ffn[0], block.ffn[2]))
    assert all(b.attn.qkv.bias is not None and b.ffn[2].bias is not None for b in TinyLanguageModel().blocks)


def test_the_ways_to_build_a_model_agree():
    cfg = ModelConfig(vocab=30, dim=16, heads=4, layers=1, max_tokens=12, norm="post")
    built = [
        TinyLanguageModel(cfg),
        TinyLanguageModel.from_config(cfg),
        TinyLanguageModel.from_config(cfg.to_dict()),
        TinyLanguageModel(vocab=30, dim=16, heads=4, layers=1, max_tokens=12, norm="post"),
        TinyLanguageModel(30, 16, 4, 1, 12, norm="post"),
        TinyLanguageModel(ModelConfig(vocab=30, dim=16, heads=4, layers=1, max_tokens=12), norm="post"),  # keywords override
    ]
    assert all(m.config == cfg for m in built)
    shapes = {k: v.shape for k, v in built[0].state_dict().items()}
    assert all({k: v.shape for k, v in m.state_dict().items()} == shapes for m in built)


def test_windowed_lm_backends_agree_across_tiles(device):
    """T = 150 spans three 64-row tiles of the tiled backend; window 70 crosses tile borders."""
    torch.manual_seed(2)
    models = [TinyLanguageModel(vocab=30, dim=32, heads=4, layers=2, max_tokens=150, window=70, backend=be).to(device).eval()
              for be in BACKENDS]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    ids = torch.randint(0, 30, (2, 150), device=device)
    with torch.no_grad():
        outs = [m(ids) for m in models]
    for other in outs[1:]:
        torch.testing.assert_close(other, outs[0], atol=1e-5, rtol=1e-5)


# ---- positions (chapter 13) ------------------------------------------------------------------------------------

POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "none")


def test_every_position_choice_builds_trains_and_counts_its_parameters():
    from tinytf.memory import parameter_count

    assert len(POSITIONS) == 5
    counts = {}
    for positions in POSITIONS:
        torch.manual_seed(0)
        model = TinyLanguageModel(vocab=30, dim=32, heads=4, layers=2, max_tokens=16, positions=positions)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = [train_step(model, opt, torch.randint(0, 30, (4, 16)))["loss"] for _ in range(3)]
        assert all(math.isfinite(v) for v in losses)
        counts[positions] = count_parameters(model)
        assert counts[positions] == parameter_count(model.config)[0]
        assert ("position.weight" in model.state_dict()) == (positions == "learned")
    assert {counts[p] for p in POSITIONS if p != "learned"} == {counts["learned"] - 16 * 32}  # only the table has parameters


def test_only_learned_positions_stop_at_max_tokens():
    ids = torch.randint(0, 30, (1, 40))
    for positions in POSITIONS[1:]:
        model = TinyLanguageModel(vocab=30, dim=32, heads=4, layers=1, max_tokens=16, positions=positions)
        assert model(ids).shape == (1, 40, 30)
    with pytest.raises(ValueError, match=r"40 positions .* exceed max_tokens=16.*relative positions: positions='rope' or 'alibi'"):
        TinyLanguageModel(vocab=30, dim=32, heads=4, layers=1, max_tokens=16)(ids)


@pytest.mark.parametrize("positions", POSITIONS)
def test_left_padded_batch_with_its_positions_equals_each_sequence_alone(positions):
    from tinytf.masks import padded_positions

    torch.manual_seed(3)
    model = TinyLanguageModel(vocab=30, dim=32, heads=4, layers=2, max_tokens=16, positions=positions).eval()
    short = torch.randint(1, 30, (1, 5))
    batch = torch.cat([torch.zeros(1, 3, dtype=torch.long), short], 1)  # 3 pads on the left
    mask = padding_mask([5], 8, side="left")
    alone = model(short)
    pos = padded_positions([5], 8)
    assert pos.tolist() == [[0, 0, 0, 0, 1, 2, 3, 4]]
    with torch.no_grad():
        fixed = model(batch, mask=mask, positions=pos)[:, 3:]
        forgot = model(batch, mask=mask)[:, 3:]  # positions 3 … 7 for tokens that are 0 … 4
    torch.testing.assert_close(fixed, alone, atol=1e-5, rtol=1e-5)
    if positions in ("learned", "sinusoidal"):
        assert (forgot - alone).abs().max() > 1e-2  # absolute positions see the offset
    else:
        torch.testing.assert_close(forgot, alone, atol=1e-4, rtol=1e-4)  # relative ones (and none) do not
