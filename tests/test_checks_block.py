"""tinytf.checks.block: ``diagnose_block`` names the deliberate bug it claims (on every input or on some inputs
only), and stays quiet on correct blocks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _diagnoses import pitfalls, titles
from torch import nn

import tinytf
from tinytf.checks import Pitfall, diagnose_block, report


class HandBlock(nn.Module):
    """A correct pre-norm causal block (hand-written) whose methods the buggy variants override."""

    def __init__(self, width: int = 16, heads: int = 4, dropout: float = 0.1) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)

    def allowed(self, t: int) -> torch.Tensor:
        return torch.ones(t, t, dtype=torch.bool).tril()

    def norm1(self, x):
        return self.ln1(x)

    def dropout(self, x):
        return self.drop(x)

    def attention(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).chunk(3, dim=-1))
        out = tinytf.scaled_dot_product_attention(q, k, v, self.allowed(t))
        return self.proj(out.transpose(1, 2).reshape(b, t, d))

    def ffn(self, x):
        return self.down(F.gelu(self.up(x)))

    def forward(self, x):
        x = x + self.dropout(self.attention(self.norm1(x)))
        return x + self.dropout(self.ffn(self.ln2(x)))


class FutureLeak(HandBlock):
    def allowed(self, t):
        return torch.ones(t, t, dtype=torch.bool)


class OneAhead(HandBlock):
    def allowed(self, t):
        return torch.ones(t, t, dtype=torch.bool).tril(1)


class BatchNormBlock(HandBlock):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(16)

    def norm1(self, x):
        return self.bn(x.transpose(1, 2)).transpose(1, 2)  # statistics over batch and time


class ManualBatchNorm(HandBlock):
    def norm1(self, x):
        return (x - x.mean(dim=0)) / (x.std(dim=0) + 1e-5)  # statistics over the batch, in eval too


class LayerNormOverTime(HandBlock):
    def __init__(self):
        super().__init__()
        self.ln_time = nn.LayerNorm([6, 16])

    def norm1(self, x):
        return self.ln_time(x)


class WideResidual(HandBlock):
    def forward(self, x):
        return x.repeat(1, 1, 4) + self.up(x)  # [B, T, 4D]: the FFN never projects back


class MismatchedResidual(HandBlock):
    def forward(self, x):
        return x + F.gelu(self.up(x))  # [B, T, D] + [B, T, 4D] raises


class DropoutInEval(HandBlock):
    def dropout(self, x):
        return F.dropout(x, 0.1)  # training=True by default


class DropoutTiedToGrad(HandBlock):
    def dropout(self, x):
        return F.dropout(x, 0.1) if torch.is_grad_enabled() else x


class ReturnsTuple(HandBlock):
    def forward(self, x):
        return super().forward(x), None  # (out, extras) is accepted


class OnlyX(nn.Module):
    """A wrapper whose forward takes x only (no mask argument); D is found inside it."""

    def __init__(self):
        super().__init__()
        self.inner = tinytf.TransformerBlock(dim=24, heads=3, max_tokens=5, dropout=0.1)

    def forward(self, x):
        return self.inner(x)


CORRECT_BLOCKS = {
    "tinytf": lambda: tinytf.TransformerBlock(dim=16, heads=4, max_tokens=16),
    "tinytf_dropout": lambda: tinytf.TransformerBlock(dim=16, heads=4, max_tokens=16, dropout=0.2),
    "tinytf_post_norm_sdpa_dropout": lambda: tinytf.TransformerBlock(dim=16, heads=2, max_tokens=16, norm="post", backend="sdpa",
                                                                     dropout=0.2),
    "handwritten": HandBlock,
    "only_x_wrapper": OnlyX,
    "returns_tuple": ReturnsTuple,
}


@pytest.mark.parametrize("name", list(CORRECT_BLOCKS))
def test_block_no_false_alarms(name):
    assert diagnose_block(CORRECT_BLOCKS[name]) == []


BUGGY_BLOCKS = {
    "future_leak": (FutureLeak, 4, "future tokens leak"),
    "off_by_one_ahead": (OneAhead, 4, "future tokens leak"),
    "batchnorm_over_batch": (BatchNormBlock, 7, "across the batch"),
    "manual_batch_statistics": (ManualBatchNorm, 7, "across the batch"),
    "layernorm_over_time": (LayerNormOverTime, 7, "time axis"),
    "residual_changes_shape": (WideResidual, 8, "shape"),
    "residual_shape_mismatch_raises": (MismatchedResidual, 8, "raised"),
    "dropout_on_in_eval": (DropoutInEval, 9, "stays on in eval"),
    "dropout_tied_to_no_grad": (DropoutTiedToGrad, 9, "autograd"),
}


@pytest.mark.parametrize("name", list(BUGGY_BLOCKS))
def test_block_names_the_bug(name):
    factory, pitfall, words = BUGGY_BLOCKS[name]
    findings = diagnose_block(factory)
    assert pitfall in pitfalls(findings), report(findings)
    assert words in titles(findings), report(findings)


def test_block_off_by_one_is_called_one_ahead():
    findings = diagnose_block(OneAhead)
    assert "exactly one token ahead" in findings[0].message, report(findings)


def test_block_dim_keyword_and_uninferable_width():
    class Opaque(nn.Module):
        def forward(self, x):
            return x * 1.0

    assert diagnose_block(Opaque, dim=8) == []
    findings = diagnose_block(Opaque)
    assert len(findings) == 1 and "infer" in findings[0].title


def test_block_factory_that_raises_is_diagnosed():
    def todo():
        raise NotImplementedError

    findings = diagnose_block(todo)
    assert len(findings) == 1 and "not implemented" in findings[0].title


def test_block_restores_the_global_rng():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    diagnose_block(DropoutInEval)
    assert torch.equal(torch.rand(3), expected)


# ---------------------------------------------------------------------------------------------------
# mistakes that show on some inputs only: named from the probes that show them
# ---------------------------------------------------------------------------------------------------
def short(x):
    return x.size(1) <= 3


class LeakForShortInputs(HandBlock):
    def allowed(self, t):
        return torch.ones(t, t, dtype=torch.bool) if t <= 3 else torch.ones(t, t, dtype=torch.bool).tril()


class BatchStatsInTrainOnly(HandBlock):
    def norm1(self, x):
        if not self.training:
            return self.ln1(x)
        return (x - x.mean(dim=(0, 1))) / (x.std(dim=(0, 1)) + 1e-5)  # over the batch, in train only


class WideResidualForSingleSequences(HandBlock):
    def forward(self, x):
        return x.repeat(1, 1, 4) + self.up(x) if x.size(0) == 1 else super().forward(x)


class DropoutInEvalForShortInputs(HandBlock):
    def dropout(self, x):
        return F.dropout(x, 0.1) if short(x) else self.drop(x)


class DropoutTiedToGradForShortInputs(HandBlock):
    def dropout(self, x):
        return F.dropout(x, 0.1) if short(x) and torch.is_grad_enabled() else self.drop(x)


PARTLY_WRONG_BLOCKS = {
    "leak_for_short_inputs": (LeakForShortInputs, Pitfall.CAUSAL_OFF_BY_ONE, "future tokens leak", "x [1, 3, 16]"),
    "batch_stats_in_train_only": (BatchStatsInTrainOnly, Pitfall.BATCH_NORM, "across the batch", "in train()"),
    "wide_residual_for_one_sequence": (WideResidualForSingleSequences, Pitfall.RESIDUAL_SHAPE, "shape", "x [1, 3, 16]"),
    "dropout_in_eval_for_short_inputs": (DropoutInEvalForShortInputs, Pitfall.TRAIN_EVAL, "stays on in eval", "x [1, 3, 16]"),
    "dropout_tied_to_grad_for_short": (DropoutTiedToGradForShortInputs, Pitfall.TRAIN_EVAL, "autograd", "x [1, 3, 16]"),
}


@pytest.mark.parametrize("name", list(PARTLY_WRONG_BLOCKS))
def test_block_names_a_mistake_on_some_inputs_only(name):
    factory, pitfall, words, where = PARTLY_WRONG_BLOCKS[name]
    findings = diagnose_block(factory)
    assert [f.pitfall for f in findings] == [pitfall], report(findings)
    assert words in findings[0].title and where in findings[0].message, report(findings)
