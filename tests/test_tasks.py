"""The copy task: layout, ignored targets, and an accuracy that means what it says."""

import pytest
import torch
import torch.nn.functional as F

from tinytf.tasks import IGNORE_INDEX, SEP, copy_batch, token_accuracy


def test_copy_batch_layout_and_targets():
    ids, targets = copy_batch(5, 4, 7, generator=torch.Generator().manual_seed(0))
    assert ids.shape == (5, 9) and targets.shape == (5, 8)
    assert torch.equal(ids[:, :4], ids[:, 5:]) and (ids[:, 4] == SEP).all()
    assert ((ids[:, :4] >= 1) & (ids[:, :4] < 7)).all()  # symbols never collide with SEP
    assert (targets[:, :4] == IGNORE_INDEX).all()
    assert torch.equal(targets[:, 4:], ids[:, 5:])  # logits at t predict ids[t + 1]: the copy


def test_copy_batch_is_reproducible_and_random():
    a = copy_batch(8, 6, 11, generator=torch.Generator().manual_seed(3))[0]
    b = copy_batch(8, 6, 11, generator=torch.Generator().manual_seed(3))[0]
    c = copy_batch(8, 6, 11, generator=torch.Generator().manual_seed(4))[0]
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert len(a[:, :6].unique()) > 3


def test_ignored_targets_drop_out_of_the_loss():
    ids, targets = copy_batch(3, 5, 9, generator=torch.Generator().manual_seed(1))
    logits = torch.randn(3, 11, 9)  # T = 2L + 1
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, 9), targets.reshape(-1))
    per = F.cross_entropy(logits[:, :-1].reshape(-1, 9), ids[:, 1:].reshape(-1), reduction="none").view(3, 10)
    torch.testing.assert_close(loss, per[:, 5:].mean())  # mean over the 5 copy targets per row only


def test_token_accuracy_counts_only_real_targets():
    targets = torch.tensor([[IGNORE_INDEX, 2, 3], [IGNORE_INDEX, 1, 1]])
    logits = F.one_hot(torch.tensor([[0, 2, 0], [2, 1, 0]]), 4).float()  # right at [0,1], [1,1]
    assert token_accuracy(logits, targets) == pytest.approx(2 / 4)
    assert token_accuracy(F.one_hot(targets.clamp(min=0), 4).float(), targets) == 1.0


def test_errors_name_the_shapes():
    with pytest.raises(ValueError, match="vocab >= 3"):
        copy_batch(2, 3, 2)
    with pytest.raises(ValueError, match="length >= 1"):
        copy_batch(2, 0, 5)
    with pytest.raises(ValueError, match=r"logits \[2, 3, 4\].*targets \[2, 2\]"):
        token_accuracy(torch.zeros(2, 3, 4), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="nothing to score"):
        token_accuracy(torch.zeros(1, 2, 4), torch.full((1, 2), IGNORE_INDEX))


def test_copy_loss_scores_only_the_copied_half_with_shifted_logits():
    from tinytf import TinyLanguageModel
    from tinytf.tasks import copy_loss

    torch.manual_seed(0)
    model = TinyLanguageModel(vocab=12, dim=16, heads=2, layers=1, max_tokens=11)
    ids, targets = copy_batch(4, 5, 12, generator=torch.Generator().manual_seed(0))
    loss, logits = copy_loss(model, ids, targets)
    assert logits.shape == (4, 10, 12)
    full = model(ids)
    by_hand = F.cross_entropy(full[:, 5:-1].reshape(-1, 12), ids[:, 6:].reshape(-1))
    assert torch.allclose(loss, by_hand) and (targets[:, :5] == IGNORE_INDEX).all()
    with pytest.raises(ValueError, match="already shifted"):
        copy_loss(model, ids, ids)
