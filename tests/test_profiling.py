"""tinytf.profiling: every profiler event lands in one of the seed's parts, the parts add up to the profiler's
own total, backward nodes follow the forward ops that made them, a saved trace gives the same breakdown, the
dtype table agrees with an independent recording of the ops, and the forward's memory profile equals the
ledger's prediction for one layer."""

from __future__ import annotations

import math

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

import tinytf
from tinytf.memory import ledger
from tinytf.profiling import (
    PARTS,
    PREFIX,
    allocated_by_part,
    classify,
    label_parts,
    op_dtypes,
    part_times,
    read_trace,
    spans_of,
    timeline,
)

D, H, B, T = 32, 4, 2, 32
ATTENTION_PARTS = {"explicit": {"scores", "softmax", "weights @ V"}, "sdpa": {"fused attention"}, "tiled": {"fused attention"}}


def _profiled(backend: str, **options):
    torch.manual_seed(0)
    block = tinytf.TransformerBlock(D, H, T, backend=backend)
    x = torch.randn(B, T, D, requires_grad=True)
    block(x).sum().backward()  # warm up: no first-call allocations in the profile
    with label_parts(block), profile(activities=[ProfilerActivity.CPU], **options) as prof:
        block(x).sum().backward()
    return prof


@pytest.fixture(scope="module", params=["explicit", "sdpa", "tiled"])
def profiled(request):
    return request.param, _profiled(request.param, record_shapes=True)


def test_the_parts_add_up_to_the_profilers_total(profiled):
    backend, prof = profiled
    times = part_times(prof.events())
    assert set(times.forward) == set(times.backward) == set(PARTS)
    grouped = sum(times.forward.values()) + sum(times.backward.values())
    own_total = sum(e.self_cpu_time_total for e in prof.events())
    assert math.isclose(grouped, times.total, rel_tol=1e-9) and math.isclose(times.total, own_total, rel_tol=1e-9)
    top_level = sum(e.cpu_time_total for e in prof.events() if e.cpu_parent is None)
    assert math.isclose(times.total, top_level, rel_tol=1e-6)  # self times partition the top-level events' time
    seen = {p for p in PARTS if times.part(p) > 0}
    assert {"QKV projection", "output projection", "FFN", "norms"} | ATTENTION_PARTS[backend] <= seen
    assert not seen & (set().union(*ATTENTION_PARTS.values()) - ATTENTION_PARTS[backend])
    assert all(times.backward[p] > 0 for p in ("QKV projection", "FFN", "norms"))
    half = times.per_call(2)
    assert half.total == times.total / 2 and all(half.part(p) == times.part(p) / 2 for p in PARTS)
    lines = times.table("en").splitlines()
    assert lines[0].startswith("part") and lines[-1].startswith("total") and "100%" in lines[-1]


def test_backward_nodes_inherit_the_part_of_the_forward_op_that_made_them():
    prof = _profiled("explicit")
    spans = spans_of(prof.events())
    parts = classify(spans)
    forward = {s.seq: parts[s][1] for s in spans if parts[s][0] == "forward" and s.seq >= 0}
    nodes = [s for s in spans if s.name.startswith("autograd::engine::evaluate_function: ")]
    assert len(nodes) > 20
    for node in nodes:
        phase, part = parts[node]
        assert phase == "backward" and part == forward.get(node.seq, "other"), node.name
    by_name = {node.name.split(": ")[1]: parts[node][1] for node in nodes}
    assert by_name["SoftmaxBackward0"] == "softmax" and by_name["GeluBackward0"] == "FFN"
    assert by_name["NativeLayerNormBackward0"] == "norms"


def test_a_saved_trace_gives_the_same_breakdown_and_a_timeline(tmp_path):
    prof = _profiled("explicit")
    path = tmp_path / "block.json"
    prof.export_chrome_trace(str(path))
    spans = read_trace(path)
    from_events, from_trace = part_times(prof.events()), part_times(spans)
    for p in PARTS:  # the trace keeps times to the nanosecond
        assert math.isclose(from_trace.part(p), from_events.part(p), rel_tol=1e-3, abs_tol=1.0), p
    bars = timeline(spans)
    starts = [b[2] for b in bars]
    assert starts == sorted(starts) and all(0 <= b[2] <= b[3] for b in bars)
    phases = [b[0] for b in bars]
    assert phases.index("backward") > phases.index("forward") and "forward" not in phases[phases.index("backward"):]
    assert {b[1] for b in bars} >= {"norms", "QKV projection", "scores", "softmax", "weights @ V", "output projection", "FFN"}


class _Dtypes(TorchDispatchMode):
    """An independent witness: the dtypes of the tensor arguments of every aten op below autocast."""

    def __init__(self):
        super().__init__()
        self.seen = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        dtypes = tuple(str(a.dtype).replace("torch.", "") for a in args if isinstance(a, torch.Tensor))
        self.seen.setdefault("aten::" + func.__name__.split(".")[0], set()).add(dtypes)
        return func(*args, **(kwargs or {}))


def test_the_autocast_dtype_table_read_from_the_profiler_is_what_the_ops_received():
    torch.manual_seed(0)
    model = tinytf.TinyLanguageModel(vocab=10, dim=D, heads=H, layers=1, max_tokens=T)
    ids = torch.randint(0, 10, (B, T))
    names = {"float32": "fp32", "bfloat16": "bf16", "int64": "int64", "bool": "bool"}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with label_parts(model), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            tinytf.lm_loss(model(ids), ids)
        with torch.no_grad(), _Dtypes() as witness:
            tinytf.lm_loss(model(ids), ids)
    table = op_dtypes(prof.events())
    assert {"aten::addmm", "aten::bmm", "aten::native_layer_norm", "aten::_softmax", "aten::gelu"} <= set(table)
    for op, counts in table.items():
        assert {tuple(names[t] for t in dt) for dt in witness.seen[op]} == set(counts), op
    assert set(table["aten::addmm"]) == {("bf16", "bf16", "bf16")} and ("fp32", "fp32", "fp32") in table["aten::native_layer_norm"]


@pytest.mark.parametrize("backend", ["explicit", "sdpa", "tiled"])
def test_the_forward_memory_profile_equals_the_ledgers_layer(backend):
    torch.manual_seed(0)
    block = tinytf.TransformerBlock(D, H, T, backend=backend)
    x = torch.randn(B, T, D, requires_grad=True)
    block(x)
    with label_parts(block), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = block(x)
    parts, net = allocated_by_part(prof.events())
    layer = (ledger(tinytf.ModelConfig(dim=D, heads=H, layers=2, max_tokens=T), B, T, attention=backend).activations
             - ledger(tinytf.ModelConfig(dim=D, heads=H, layers=1, max_tokens=T), B, T, attention=backend).activations)
    # net = the output (B·T·D) + what is saved, less the input (B·T·D, allocated before): the layer's saved tensors
    assert abs(net / layer - 1) < 1e-3, (net, layer)
    assert parts["FFN"] == 2 * B * T * 4 * D * 4 + B * T * D * 4  # GELU input, GELU output, the second Linear's output
    assert out.shape == x.shape


def test_label_parts_needs_a_block_and_removes_its_hooks():
    with pytest.raises(ValueError, match="no Transformer block"):
        with label_parts(torch.nn.Linear(2, 2)):
            pass
    block = tinytf.TransformerBlock(D, H, T)
    with label_parts(block):
        pass
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        block(torch.randn(1, 4, D))
    assert not [e for e in prof.events() if e.name.startswith(PREFIX)]
