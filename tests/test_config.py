"""ModelConfig (tinytf/config.py): every architectural choice validated once, in one place, with the
same messages whether it comes through the config, the model or a block's keyword constructor."""

import dataclasses

import pytest
import torch

from tinytf import (
    CausalSelfAttention,
    ModelConfig,
    MultiHeadAttention,
    TinyLanguageModel,
    TransformerBlock,
    load_checkpoint,
    save_checkpoint,
)
from tinytf.config import BACKENDS, NORMS

CHOICES = {"norm": "post", "dropout": 0.1, "backend": "sdpa", "bias": False}


def test_config_dict_round_trip_and_old_dicts_get_the_defaults():
    cfg = ModelConfig(vocab=7, dim=12, heads=3, layers=3, max_tokens=5, expansion=2, **CHOICES)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert all(type(v) in (int, float, str, bool, type(None)) for v in cfg.to_dict().values())
    old = {"vocab": 7, "dim": 12, "heads": 3, "layers": 3, "max_tokens": 5, "expansion": 4}  # saved before norm/dropout/...
    assert ModelConfig.from_dict(old) == ModelConfig(7, 12, 3, 3, 5, 4, norm="pre", dropout=0.0, backend="explicit", bias=True)
    with pytest.raises(ValueError, match=r"unknown ModelConfig field.*'moe_experts'"):  # a field of a newer version
        ModelConfig.from_dict({**old, "moe_experts": 8})
    with pytest.raises(ValueError, match="unknown ModelConfig field.*'nrom'"):
        TinyLanguageModel(nrom="post")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dim": 30, "heads": 4}, r"dim=30 is not divisible by heads=4.*divisors of 30"),
        ({"heads": 0}, "dim and heads must be positive"),
        ({"norm": "middle"}, r"norm must be 'pre' or 'post', got 'middle'"),
        ({"backend": "flash"}, r"backend must be one of \('explicit', 'sdpa', 'tiled'\), got 'flash'"),
        ({"dropout": 1.0}, r"dropout must be a probability in \[0, 1\), got 1.0"),
        ({"dropout": -0.1}, r"dropout must be a probability"),
        ({"vocab": 0}, "vocab must be a positive integer"),
        ({"layers": 0}, "layers must be a positive integer"),
        ({"max_tokens": -1}, "max_tokens must be a positive integer"),
        ({"expansion": 0}, "expansion must be a positive integer"),
        ({"dim": 32.0}, r"dim must be an integer, got 32.0"),
        ({"bias": "no"}, "bias must be True or False"),
        ({"window": 0}, "window must be a positive integer"),
    ],
)
def test_config_validates_itself(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**fields)
    with pytest.raises(ValueError, match=message):
        TinyLanguageModel(**fields)


def test_config_is_frozen_and_normalises_integer_types():
    cfg = ModelConfig(vocab=torch.tensor(9), dim=16)
    assert cfg.vocab == 9 and type(cfg.vocab) is int
    with pytest.raises(AttributeError):
        cfg.norm = "post"  # type: ignore[misc]


def test_the_allowed_choices_are_the_configs():
    assert NORMS == ("pre", "post") and BACKENDS == ("explicit", "sdpa", "tiled")
    for norm in NORMS:
        assert TransformerBlock(dim=16, heads=2, norm=norm).norm_position == norm
    for backend in BACKENDS:
        assert MultiHeadAttention(16, 2, backend=backend).backend == backend


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: MultiHeadAttention(30, 4), r"dim=30 is not divisible by heads=4.*divisors of 30"),
        (lambda: TransformerBlock(dim=30, heads=4), r"dim=30 is not divisible by heads=4"),
        (lambda: MultiHeadAttention(16, 4, kv_heads=3), r"kv_heads=3 does not divide heads=4.*among \[1, 2, 4\]"),
        (lambda: MultiHeadAttention(16, 4, backend="flash"), r"backend must be one of \('explicit', 'sdpa', 'tiled'\)"),
        (lambda: MultiHeadAttention(16, 4, dropout=1.0), r"dropout must be a probability in \[0, 1\)"),
        (lambda: CausalSelfAttention(16, 4, 8, window=0), "window must be a positive integer"),
        (lambda: CausalSelfAttention(16, 4, 0), "max_tokens must be a positive integer"),
        (lambda: TransformerBlock(norm="middle"), r"norm must be 'pre' or 'post', got 'middle'"),
        (lambda: TransformerBlock(expansion=0), "expansion must be a positive integer"),
    ],
)
def test_keyword_constructors_say_what_the_config_says(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize("fields", [{}, {"kv_heads": 2, "window": 3}, CHOICES])
def test_modules_built_from_a_config_equal_those_built_from_its_values(fields):
    cfg = ModelConfig(dim=16, heads=4, max_tokens=8, expansion=2, **fields)
    def values(*names):
        return {k: getattr(cfg, k) for k in names}

    attention = ("kv_heads", "bias", "dropout", "backend")
    pairs = [
        (TransformerBlock(cfg), TransformerBlock(16, 4, 8, 2, **values("norm", "window", *attention))),
        (CausalSelfAttention(cfg), CausalSelfAttention(16, 4, 8, **values("window", *attention))),
        (MultiHeadAttention(cfg), MultiHeadAttention(16, 4, **values(*attention))),
    ]
    x = torch.randn(2, 8, 16)
    for from_config, from_values in pairs:
        assert {k: v.shape for k, v in from_config.state_dict().items()} == {k: v.shape for k, v in from_values.state_dict().items()}
        from_values.load_state_dict(from_config.state_dict())
        from_config.eval(), from_values.eval()
        torch.testing.assert_close(from_config(x), from_values(x), atol=0, rtol=0)
    block = pairs[0][0]
    assert block.attn.window == cfg.window and block.attn.kv_heads == cfg.n_kv_heads and block.attn.max_tokens == 8


def test_a_config_and_other_values_at_once_is_an_error_that_shows_the_fix():
    cfg = ModelConfig(dim=16, heads=4)
    fix = r"dataclasses.replace\(config, heads=8\)"
    with pytest.raises(ValueError, match=r"TransformerBlock\(config, \.\.\.\) takes every size.*'heads': 8.*" + fix):
        TransformerBlock(cfg, heads=8)
    with pytest.raises(ValueError, match=r"MultiHeadAttention\(config, \.\.\.\).*'backend': 'sdpa'"):
        MultiHeadAttention(cfg, backend="sdpa")
    assert TransformerBlock(dataclasses.replace(cfg, heads=8)).attn.heads == 8


def test_kv_heads_must_divide_heads():
    for bad in (3, 0, 5, 8):
        with pytest.raises(ValueError, match=rf"kv_heads={bad} does not divide heads=4.*among \[1, 2, 4\]"):
            MultiHeadAttention(32, 4, kv_heads=bad)
    with pytest.raises(ValueError, match=r"kv_heads=3 does not divide heads=4"):
        ModelConfig(dim=32, heads=4, kv_heads=3)
    with pytest.raises(ValueError, match="kv_heads must be an integer"):
        ModelConfig(dim=32, heads=4, kv_heads=True)


def test_config_kv_heads_defaults_and_canonical_form(tmp_path):
    assert ModelConfig(heads=4, kv_heads=4) == ModelConfig(heads=4)
    assert ModelConfig(heads=4, kv_heads=4).kv_heads is None and ModelConfig(heads=4).n_kv_heads == 4
    assert ModelConfig(heads=4, kv_heads=1).n_kv_heads == 1
    old = {"vocab": 7, "dim": 12, "heads": 3, "layers": 1, "max_tokens": 5}  # a dict from before the field
    assert ModelConfig.from_dict(old).kv_heads is None and ModelConfig.from_dict(old).window is None
    model = TinyLanguageModel(vocab=20, dim=16, heads=4, layers=2, max_tokens=8, kv_heads=2).eval()
    loaded = load_checkpoint(save_checkpoint(tmp_path / "g.pt", model)).model.eval()
    assert loaded.config.kv_heads == 2
    ids = torch.randint(0, 20, (2, 8))
    torch.testing.assert_close(loaded(ids), model(ids), atol=0, rtol=0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"positions": "rotary"}, r"positions must be one of \('learned', 'sinusoidal', 'rope', 'alibi', 'none'\)"),
        ({"positions": "rope", "dim": 30, "heads": 2}, r"rotary_dim must be even.*d_head itself is odd: change dim or heads"),
        ({"positions": "rope", "rotary_dim": 12}, r"at most d_head = dim / heads = 8, got rotary_dim=12"),
        ({"positions": "rope", "rotary_dim": 5}, r"Choose an even rotary_dim <= 8"),
        ({"positions": "rope", "rope_base": 1}, r"rope_base must be > 1"),
        ({"positions": "rope", "rope_layout": "neox"}, r"rope_layout must be 'half'"),
        ({"positions": "rope", "rope_scaling": "dynamic"}, r"rope_scaling must be None or one of \('linear', 'ntk', 'yarn'\)"),
        ({"positions": "rope", "rope_factor": 4}, r"comes with a rope_scaling"),
        ({"positions": "rope", "rope_scaling": "linear", "rope_factor": 0.5}, r"must be >= 1"),
        ({"rotary_dim": 4}, r"\{'rotary_dim': 4\} configure rotary positions, but positions='learned'. Set positions='rope'"),
        ({"positions": "alibi", "backend": "tiled"}, r"backend='explicit' or 'sdpa' with ALiBi"),
    ],
)
def test_positions_are_validated_once_with_the_fix(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**fields)


def test_positions_default_to_learned_and_travel_in_the_dict():
    assert ModelConfig().positions == "learned"
    cfg = ModelConfig(positions="rope", rotary_dim=4, rope_layout="interleaved", rope_scaling="yarn", rope_factor=2, rope_base=500000)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg and cfg.rope_factor == 2.0 and cfg.rotary_width == 4
    assert ModelConfig(positions="rope").rotary_width == ModelConfig().head_dim
