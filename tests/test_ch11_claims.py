"""Chapter 11 (smaller KV caches) states numbers in its prose; each is recomputed here from tinytf
(or read from the chapter's own constants) and must still be stated, in both editions."""

from __future__ import annotations

import ast

import pytest
from _claims import code_cell, prose, stated

import tinytf
from tinytf.memory import KiB, format_bytes, kv_cache_bytes

CHAPTER = "11_smaller_kv_caches.ipynb"
SEVEN_B = dict(layers=32, heads=32, head_dim=128, dtype="fp16")  # section 4's shape


@pytest.fixture(scope="module")
def text() -> dict[str, str]:
    return prose(CHAPTER)


def _steps() -> tuple[tuple[int, int], tuple[int, int]]:
    """``(STEPS, UPTRAIN)`` for fast and for fast = False, from the chapter's own assignment."""
    found = [node.value for node in ast.walk(code_cell(CHAPTER, "271e50e0")) if isinstance(node, ast.Assign)
             and [ast.unparse(t) for t in node.targets] == ["(STEPS, UPTRAIN)"]]
    assert len(found) == 1, "section 5 must assign STEPS, UPTRAIN once"
    [value] = found
    assert isinstance(value, ast.IfExp) and ast.unparse(value.test) == "fast"
    return ast.literal_eval(value.body), ast.literal_eval(value.orelse)


def test_uptraining_fraction_is_stated_next_to_the_papers(text):
    (steps, up), (steps_slow, up_slow) = _steps()
    share, share_slow = f"{up / steps:.0%}", f"{up_slow / steps_slow:.0%}"
    stated(text, {"en": f"{up} of its {steps} training steps, {share}", "zh": f"{steps} 步训练中的 {up} 步，即 {share}"},
           {"en": f"{up_slow} of {steps_slow}, {share_slow}", "zh": f"{steps_slow} 步中的 {up_slow} 步，{share_slow}"},
           f"{up / steps:.0%}", "5%")
    assert up / steps > 0.05 and up_slow / steps_slow > 0.05  # far more than the paper's share: the prose says so


def test_train_updates_every_parameter(text):
    tree = code_cell(CHAPTER, "271e50e0")
    [train] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "train"]
    optimisers = [ast.unparse(n) for n in ast.walk(train) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("AdamW")]
    assert len(optimisers) == 1 and optimisers[0].startswith("torch.optim.AdamW(model.parameters(),")
    assert "requires_grad_(False)" not in ast.unparse(tree)  # nothing frozen
    stated(text, {"en": "updates **every** parameter", "zh": "更新**每一个**参数"})


def test_receptive_field_conventions(text):
    layers, window = 32, 4096  # Mistral 7B
    mask = tinytf.causal_mask(window + 10, window=window)
    assert int(mask[-1].sum()) == window  # this chapter's window: W keys, the query's own included
    ours, papers = layers * (window - 1), layers * window  # reach W - 1 per layer; the paper's i - W … i reaches W
    stated(text, f"32 × 4095 = {ours:,}", f"32 × 4096 = {papers:,}", "131K")


def test_seven_b_table_ratios_and_the_hypothetical_column(text):
    per = {kv: kv_cache_bytes(1, tokens=1, kv_heads=kv, **SEVEN_B) for kv in (32, 8, 1)}
    assert len(per) == 3
    stated(text, {"en": f"{per[32] // per[8]}× smaller", "zh": f"缩小 {per[32] // per[8]}×"}, f"{per[32] // per[1]}×")
    stated(text, {"en": "**hypothetical**", "zh": "**假想的**"})


def test_real_models(text):
    tree = code_cell(CHAPTER, "7c0aac6a")
    [models] = [ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                and [ast.unparse(t) for t in n.targets] == ["REAL_MODELS"]]
    assert len(models) == 5
    layers, heads, kv, hd = models["Llama 2 70B (GQA)"]
    own = kv_cache_bytes(1, layers, heads, 1, hd, "fp16", kv_heads=kv)
    full = kv_cache_bytes(1, layers, heads, 1, hd, "fp16")
    stated(text, f"{own // KiB} KiB", format_bytes(full),
           {"en": f"{heads} query heads sharing {kv} K/V heads", "zh": f"{heads} 个查询头共享 {kv} 个 K/V 头"})
    stated(text, {"en": f"{layers} layers", "zh": f"{layers} 层"})
    for name in ("Falcon-7B (MQA)", "PaLM 8B (MQA)"):
        _, q_heads, kv_heads, width = models[name]
        assert kv_heads == 1 and (q_heads, width) != (SEVEN_B["heads"], SEVEN_B["head_dim"])  # MQA, not the 7B shape
        stated(text, {"en": f"{q_heads} query heads of {width}" if name.startswith("Falcon") else f"{q_heads} of {width}",
                      "zh": f"{q_heads} 个宽 {width} 的"})


def test_check_yourself_answers(text):
    gqa = kv_cache_bytes(1, 40, 40, 1, 128, "bf16", kv_heads=8)
    mha = kv_cache_bytes(1, 40, 40, 1, 128, "bf16")
    stated(text, f"{gqa:,}", f"{mha:,}", f"{gqa // KiB} KiB", f"{mha // KiB} KiB")
    reach = 4 * (256 - 1)
    stated(text, f"{reach:,}", f"{10_000 - reach:,}")


def test_references_cited(text):
    stated(text, "arXiv:1911.02150", "arXiv:2305.13245", "arXiv:2004.05150", "arXiv:2310.06825")
