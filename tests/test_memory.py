"""tinytf.memory: every ledger formula is checked against a measurement, never a typed-in number.

Measurements: bytes autograd saves for backward (SavedTensorMeter), the peak of live tensors
(PeakMemoryMeter: a dispatch-mode tracker on CPU, torch.cuda statistics on CUDA), tensors held
by the model and the optimizer (state_bytes), the meta device for a tensor's size."""

import json

import pytest
import torch

import tinytf
from tinytf.memory import (
    GiB,
    Ledger,
    PeakMemoryMeter,
    SavedTensorMeter,
    attention_matrix_bytes,
    dtype_bytes,
    kv_cache_bytes,
    ledger,
    parameter_count,
    state_bytes,
    tiled_working_set,
)

CONFIGS = [  # (B, T, dim, heads, layers, vocab)
    (2, 64, 32, 4, 2, 50),
    (1, 128, 16, 2, 1, 30),
    (3, 32, 64, 4, 3, 200),
]


def make_model(dim, heads, layers, vocab, tokens, backend="explicit", expansion=4, dtype=torch.float32, device="cpu", bias=True):
    torch.manual_seed(0)
    model = tinytf.TinyLanguageModel(vocab=vocab, dim=dim, heads=heads, layers=layers, max_tokens=tokens,
                                     expansion=expansion, backend=backend, bias=bias)
    return model.to(device=device, dtype=dtype)


def saved_bytes(model, ids):
    """Measured: bytes of the distinct storages one forward + loss keeps for backward."""
    with SavedTensorMeter(exclude=model.parameters()) as saved:
        loss = tinytf.lm_loss(model(ids), ids)
    del loss
    return saved.nbytes


# -- single terms ---------------------------------------------------------------------------------

def test_attention_matrix_bytes_matches_a_meta_tensor_and_the_article_example():
    for shape, dtype in [((2, 3, 5, 5), torch.float32), ((8, 16, 4096, 4096), torch.float16), ((1, 1, 7, 7), torch.bfloat16)]:
        t = torch.empty(shape, dtype=dtype, device="meta")  # no memory is allocated on the meta device
        assert attention_matrix_bytes(shape[0], shape[1], shape[2], dtype) == t.numel() * t.element_size()
    # The article's worked example (B=8, H=16, T=4096, fp16) is 2^31 elements, twice its "1.07 billion / 2 GiB".
    assert torch.empty(8, 16, 4096, 4096, device="meta").numel() == 2**31
    assert attention_matrix_bytes(8, 16, 4096, "fp16") / GiB == 4 * attention_matrix_bytes(8, 16, 2048, "fp16") / GiB


def test_dtype_bytes_matches_element_size_and_rejects_unknown_names():
    for name, dtype in [("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32), ("float64", torch.float64)]:
        assert dtype_bytes(name) == dtype_bytes(dtype) == torch.empty(0, dtype=dtype).element_size()
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_bytes("fp8")


@pytest.mark.parametrize("dim,heads,layers,vocab,tokens,expansion", [(32, 4, 2, 100, 64, 4), (16, 2, 1, 30, 12, 2), (48, 6, 3, 7, 9, 3)])
@pytest.mark.parametrize("bias", [True, False])
def test_parameter_count_matches_the_module(dim, heads, layers, vocab, tokens, expansion, bias):
    model = make_model(dim, heads, layers, vocab, tokens, expansion=expansion, bias=bias)
    n, tensors = parameter_count(model.config)
    assert n == tinytf.count_parameters(model)
    assert tensors == len(list(model.parameters()))


def test_kv_cache_bytes_matches_an_allocated_cache():
    model = make_model(32, 4, 3, 50, 40)
    for batch, tokens in [(1, 40), (3, 17)]:
        cache = tinytf.KVCache.for_model(model, batch, max_tokens=tokens)
        assert cache.nbytes() == kv_cache_bytes(batch, 3, 4, tokens, 8, torch.float32)
        assert ledger(model, batch, tokens, torch.float32, training=False).kv_cache == cache.nbytes()


# -- training: activations saved for backward ----------------------------------------------------

@pytest.mark.parametrize("backend", ["explicit", "sdpa", "tiled"])
@pytest.mark.parametrize("B,T,dim,heads,layers,vocab", CONFIGS)
def test_training_activations_match_saved_tensors(backend, B, T, dim, heads, layers, vocab):
    model = make_model(dim, heads, layers, vocab, T, backend)
    ids = torch.randint(0, vocab, (B, T))
    measured = saved_bytes(model, ids)
    predicted = ledger(model.config, B, T, torch.float32, attention=backend).activations
    assert abs(predicted - measured) <= 0.01 * measured, (predicted, measured)


def test_training_activations_in_bf16_match_saved_tensors():
    model = make_model(32, 4, 2, 50, 64, dtype=torch.bfloat16)
    ids = torch.randint(0, 50, (2, 64))
    measured = saved_bytes(model, ids)
    predicted = ledger(model, 2, 64, torch.bfloat16).activations
    assert abs(predicted - measured) <= 0.02 * measured, (predicted, measured)


def test_attention_term_isolated_by_switching_to_the_fused_path():
    """explicit − fused isolates the [B, H, T, T] tensors; the prediction must match that difference."""
    B, T = 2, 128
    diffs = []
    for backend in ("explicit", "sdpa"):
        model = make_model(32, 4, 2, 50, T, backend)
        diffs.append((saved_bytes(model, torch.randint(0, 50, (B, T))), ledger(model, B, T, torch.float32, attention=backend)))
    (m_exp, l_exp), (m_sdpa, l_sdpa) = diffs
    assert l_sdpa.attention == 0 and l_exp.attention == 2 * 2 * attention_matrix_bytes(B, 4, T, torch.float32)
    measured = m_exp - m_sdpa
    predicted = l_exp.activations - l_sdpa.activations
    assert abs(predicted - measured) <= 0.05 * measured
    assert l_exp.attention >= 0.9 * measured  # the T×T tensors are almost all of the difference


def test_tiled_attention_term_is_the_saved_output_and_lse():
    """tiled − fused isolates what the tiled backward keeps beyond the fused kernel: one [B, H, T, d]
    output per layer (the fused kernel's output is the merged heads' storage) and lse in dtype, not fp32."""
    B, T, layers = 2, 128, 3
    measured = {be: saved_bytes(make_model(32, 4, layers, 50, T, be), torch.randint(0, 50, (B, T))) for be in ("tiled", "sdpa")}
    l_tiled, l_sdpa = (ledger(make_model(32, 4, layers, 50, T, be), B, T, torch.float32, attention=be) for be in ("tiled", "sdpa"))
    assert l_tiled.attention == layers * (B * T * 32 + B * 4 * T) * 4
    assert l_tiled.activations - l_sdpa.activations == measured["tiled"] - measured["sdpa"] == layers * B * T * 32 * 4


@pytest.mark.parametrize("B,T,heads,head_dim", [(2, 64, 4, 8), (1, 300, 2, 16), (3, 40, 1, 32)])
def test_tiled_working_set_matches_the_measured_peak_of_one_call(B, T, heads, head_dim):
    q, k, v = (torch.randn(B, heads, T, head_dim) for _ in range(3))
    with torch.no_grad(), PeakMemoryMeter("cpu") as meter:
        out = tinytf.tiled_attention(q, k, v, is_causal=True)
    predicted = out.numel() * 4 + B * heads * T * 4 + tiled_working_set(B, heads, T, head_dim, torch.float32)
    assert abs(predicted - meter.peak) <= 0.05 * meter.peak, (predicted, meter.peak)


def test_tiled_attention_term_grows_linearly_explicit_quadratically():
    cfg = tinytf.ModelConfig(vocab=100, dim=512, heads=8, layers=2, max_tokens=8192)
    tiled = [ledger(cfg, 1, t, "fp32", attention="tiled").attention for t in (2048, 4096)]
    explicit = [ledger(cfg, 1, t, "fp32", attention="explicit").attention for t in (2048, 4096)]
    assert tiled[1] == 2 * tiled[0] and explicit[1] == 4 * explicit[0] and 20 * tiled[1] < explicit[1]
    # at inference one block's working set does not grow with T once T exceeds the tile
    assert tiled_working_set(1, 8, 4096, 64, "fp32") == tiled_working_set(1, 8, 64, 64, "fp32") > tiled_working_set(1, 8, 32, 64, "fp32")


def test_ffn_term_isolated_by_changing_the_expansion():
    B, T = 2, 32
    m = {e: saved_bytes(make_model(32, 4, 2, 50, T, expansion=e), torch.randint(0, 50, (B, T))) for e in (2, 4)}
    l4 = ledger(make_model(32, 4, 2, 50, T, expansion=4), B, T, torch.float32)
    l2 = ledger(make_model(32, 4, 2, 50, T, expansion=2), B, T, torch.float32)
    assert abs((l4.ffn - l2.ffn) - (m[4] - m[2])) <= 0.05 * (m[4] - m[2])


def test_attention_term_quadruples_and_hidden_doubles_when_T_doubles():
    cfg = tinytf.ModelConfig(vocab=100, dim=64, heads=8, layers=2, max_tokens=4096)
    a, b = ledger(cfg, 4, 1024, "fp16"), ledger(cfg, 4, 2048, "fp16")
    assert b.attention == 4 * a.attention
    assert b.hidden == 2 * a.hidden and b.ffn == 2 * a.ffn
    assert b.parameters == a.parameters


# -- training: parameters, gradients, optimizer state ---------------------------------------------

@pytest.mark.parametrize("name,make_opt", [
    ("adamw", lambda p: torch.optim.AdamW(p, lr=1e-3)),
    ("sgd", lambda p: torch.optim.SGD(p, lr=1e-2)),
    ("sgd_momentum", lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9)),
])
def test_parameter_gradient_and_optimizer_bytes_match_tensors_after_a_step(name, make_opt):
    model = make_model(32, 4, 2, 50, 16)
    opt = make_opt(model.parameters())
    ids = torch.randint(0, 50, (2, 16))
    opt.zero_grad()
    tinytf.lm_loss(model(ids), ids).backward()
    opt.step()
    measured = state_bytes(model, opt)
    predicted = ledger(model, 2, 16, torch.float32, optimizer=name)
    assert measured == {"parameters": predicted.parameters, "gradients": predicted.gradients,
                        "optimizer_state": predicted.optimizer_state}


def test_mixed_precision_adamw_costs_16_bytes_per_parameter_plus_step_counters():
    cfg = tinytf.ModelConfig(vocab=1000, dim=256, heads=8, layers=4, max_tokens=512)
    n, tensors = parameter_count(cfg)
    mp = ledger(cfg, 1, 8, "fp16", mixed_precision=True)
    per_param = (mp.parameters + mp.gradients + mp.optimizer_state + mp.master_weights - 4 * tensors) / n
    assert per_param == 2 + 2 + 8 + 4
    pure = ledger(cfg, 1, 8, "fp16")
    assert pure.master_weights == 0 and mp.master_weights == 4 * n
    assert ledger(cfg, 1, 8, "fp16", training=False).gradients == 0


# -- peaks ---------------------------------------------------------------------------------------

def test_peak_meter_counts_new_tensors_only_and_sees_frees():
    base = torch.randn(256, 256)  # allocated before: not counted
    with PeakMemoryMeter("cpu") as meter:
        a = base @ base  # 256 KiB
        b = a * 2  # 256 KiB: peak = 512 KiB
        del a
        c = b + 1  # a was freed: still 512 KiB live
        del b, c
    assert meter.peak == 2 * base.numel() * base.element_size()


@pytest.mark.parametrize("backend", ["explicit", "sdpa", "tiled"])
@pytest.mark.parametrize("B,T,dim,heads,vocab,phase", [
    (2, 256, 32, 4, 50, "attention"),  # long context: the T×T tensors dominate (explicit)
    (2, 32, 32, 2, 1000, "logits"),  # big vocabulary, short context
    (2, 32, 128, 2, 50, "ffn"),
])
def test_inference_peak_matches_the_measured_peak(backend, B, T, dim, heads, vocab, phase):
    model = make_model(dim, heads, 2, vocab, T, backend).eval()
    ids = torch.randint(0, vocab, (B, T))
    with torch.no_grad(), PeakMemoryMeter("cpu") as meter:
        model(ids)
    pred = ledger(model, B, T, torch.float32, training=False, attention=backend)
    assert abs(pred.activations - meter.peak) <= 0.10 * meter.peak, (pred.activations, meter.peak, pred.peak_phase)
    if backend == "explicit" or phase != "attention":
        # at T=32 a 64-row tile is the whole [T, T] score matrix: tiled then peaks in attention, not the FFN
        assert pred.peak_phase == ("attention" if backend == "tiled" and phase == "ffn" else phase)


@pytest.mark.parametrize("backend", ["explicit", "sdpa", "tiled"])
def test_training_step_peak_is_within_25_percent_of_the_ledger_total(backend):
    """The total adds every component as if all were live at once; backward frees activations while
    it builds gradients and allocates transients, so this is an estimate (stated in chapter 05)."""
    B, T = 2, 64
    model = make_model(32, 4, 2, 50, T, backend)
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    ids = torch.randint(0, 50, (B, T))
    tinytf.train_step(model, opt, ids)  # creates the optimizer state
    before = state_bytes(model, opt)
    model.zero_grad(set_to_none=True)
    with PeakMemoryMeter("cpu") as meter:
        tinytf.train_step(model, opt, ids)
    measured = meter.peak + before["parameters"] + before["optimizer_state"]
    total = ledger(model, B, T, torch.float32, attention=backend).total
    assert 0.75 * measured <= total <= 1.25 * measured, (total, measured)


# -- the object ----------------------------------------------------------------------------------

def test_ledger_totals_table_and_json():
    cfg = tinytf.ModelConfig(vocab=100, dim=64, heads=4, layers=2, max_tokens=256)
    model = make_model(64, 4, 2, 100, 256)
    led = ledger(cfg, 8, 256, "bf16")
    assert isinstance(led, Ledger) and led == ledger(model, 8, 256, torch.bfloat16)  # config or model
    assert led.total == sum(led.components().values())
    assert led.activations == led.hidden + led.ffn + led.attention + led.logits + led.other
    text = led.table()
    assert "attention" in text and "total" in text and ("MiB" in text or "GiB" in text)
    assert json.loads(json.dumps(led.to_dict()))["total"] == led.total
    inf = ledger(cfg, 8, 256, "bf16", training=False)
    assert inf.gradients == inf.optimizer_state == 0 and inf.kv_cache > 0 and "inference" in inf.table()


def test_ledger_rejects_bad_arguments():
    cfg = tinytf.ModelConfig()
    with pytest.raises(ValueError, match="optimizer"):
        ledger(cfg, 1, 8, "fp32", optimizer="lion")
    with pytest.raises(ValueError, match="attention"):
        ledger(cfg, 1, 8, "fp32", attention="flash")
    with pytest.raises(ValueError, match="tokens"):
        ledger(cfg, 1, 1, "fp32")
    with pytest.raises(ValueError, match="ModelConfig"):
        ledger({"dim": 3}, 1, 8, "fp32")


# -- CUDA: the allocator's own statistics --------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["explicit", "sdpa"])
def test_cuda_activations_match_max_memory_allocated(cuda, backend):
    B, T = 4, 512
    model = make_model(64, 4, 2, 100, T, backend, device=cuda)
    ids = torch.randint(0, 100, (B, T), device=cuda)
    model(ids)  # warm up kernels and workspaces
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    loss = tinytf.lm_loss(model(ids), ids)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - start  # what the forward keeps alive for backward
    del loss
    pred = ledger(model, B, T, torch.float32, attention=backend).activations
    assert abs(pred - held) <= 0.10 * held, (pred, held)


@pytest.mark.cuda
def test_cuda_inference_peak_matches_max_memory_allocated(cuda):
    B, T = 4, 1024
    model = make_model(64, 4, 2, 100, T, "explicit", device=cuda).eval()
    ids = torch.randint(0, 100, (B, T), device=cuda)
    with torch.no_grad():
        model(ids)
        with PeakMemoryMeter(cuda) as meter:
            model(ids)
    pred = ledger(model, B, T, torch.float32, training=False).activations
    assert abs(pred - meter.peak) <= 0.15 * meter.peak, (pred, meter.peak)


# -- grouped-query attention and the sliding window ---------------------------------------------

@pytest.mark.parametrize("kv_heads", [2, 1])
@pytest.mark.parametrize("bias", [True, False])
def test_parameter_count_of_a_grouped_query_model(kv_heads, bias):
    model = tinytf.TinyLanguageModel(vocab=50, dim=32, heads=4, layers=2, max_tokens=16, kv_heads=kv_heads, bias=bias)
    assert parameter_count(model.config) == (tinytf.count_parameters(model), len(list(model.parameters())))


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_kv_cache_bytes_shrink_exactly_by_heads_over_kv_heads(kv_heads):
    model = tinytf.TinyLanguageModel(vocab=50, dim=32, heads=4, layers=3, max_tokens=40, kv_heads=kv_heads)
    cache = tinytf.KVCache.for_model(model, 2)
    measured = sum(t.untyped_storage().nbytes() for t in (cache.k, cache.v))
    assert measured == cache.nbytes() == kv_cache_bytes(2, 3, 4, 40, 8, torch.float32, kv_heads=kv_heads)
    assert ledger(model, 2, 40, torch.float32, training=False).kv_cache == measured
    full = kv_cache_bytes(2, 3, 4, 40, 8, torch.float32)
    assert full % measured == 0 and full // measured == 4 // kv_heads
    windowed = tinytf.TinyLanguageModel(model.config, window=10)
    rolling = tinytf.RollingKVCache.for_model(windowed, 2)
    assert ledger(windowed, 2, 40, torch.float32, training=False).kv_cache == rolling.nbytes() == measured // 4
    with pytest.raises(ValueError, match="kv_heads=3 does not divide heads=4"):
        kv_cache_bytes(1, 1, 4, 8, 8, "fp16", kv_heads=3)


@pytest.mark.parametrize("backend", ["explicit", "sdpa", "tiled"])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_grouped_query_activations_match_saved_tensors_and_the_inference_peak(backend, kv_heads):
    B, T = 2, 64
    torch.manual_seed(0)
    model = tinytf.TinyLanguageModel(vocab=50, dim=32, heads=4, layers=2, max_tokens=T, backend=backend, kv_heads=kv_heads)
    ids = torch.randint(0, 50, (B, T))
    measured = saved_bytes(model, ids)
    assert abs(ledger(model, B, T, torch.float32, attention=backend).activations - measured) <= 0.01 * measured
    model.eval()
    with torch.no_grad(), PeakMemoryMeter("cpu") as meter:
        model(ids)
    pred = ledger(model, B, T, torch.float32, training=False, attention=backend)
    assert abs(pred.activations - meter.peak) <= 0.10 * meter.peak, (pred.activations, meter.peak)


def test_the_ledger_table_and_its_comparison_rows_speak_the_notebooks_language(monkeypatch):
    """Chapter 05 (issue 35): the Chinese edition reads the ledger's rows in Chinese; the English table is unchanged."""
    from tinytf.memory import LEDGER_ROWS, ledger, ledger_label

    model = tinytf.TinyLanguageModel(vocab=16, dim=16, heads=2, layers=1, max_tokens=8)
    monkeypatch.setenv("TINYTF_LANG", "en")
    en = ledger(model, 2, 8, torch.float32).table()
    assert en.startswith("ledger: training step, B=2, T=8, fp32, attention=explicit, optimizer=adamw")
    assert "  optimizer_state " in en and "    activations/attention " in en and "  total " in en
    assert ledger_label("attention_saved") == "attention: explicit - fused"
    monkeypatch.setenv("TINYTF_LANG", "zh")
    zh = ledger(model, 2, 8, torch.float32, training=False).table()
    assert zh.startswith("显存账本：推理（预填充），峰值出现在") and "优化器状态" in zh and "激活/注意力" in zh and "合计" in zh
    assert not [w for w in ("parameters", "gradients", "optimizer", "activations", "total", "ledger") if w in zh.split("attention=")[1]]
    labels = [ledger_label(key, 24) for key in LEDGER_ROWS]
    assert len(labels) == 8 and all(not any("a" <= ch <= "z" for ch in label.split("：")[0]) for label in labels), labels
    assert {len(label) + sum(ord(ch) > 0x2E80 for ch in label) for label in labels} == {24}  # aligned as printed
