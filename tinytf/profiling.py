"""Where a block's time goes: torch.profiler's events grouped into the seed article's parts.

    with label_parts(block), torch.profiler.profile(record_shapes=True) as prof:
        block(x).sum().backward()
    times = part_times(prof.events())        # self time per part, forward and backward
    print(times.table())

:func:`label_parts` wraps the block's submodules in ``record_function`` ranges (``tinytf::norms``,
``tinytf::QKV projection``, ``tinytf::attention``, ``tinytf::output projection``, ``tinytf::FFN``). Every
profiler event then belongs to one part: the innermost range around it; inside the attention core the
ops before the softmax are the **scores**, the softmax op is the **softmax**, the ops after it are
**weights @ V** (a fused kernel without a separate softmax is **fused attention**). A backward node
(``autograd::engine::evaluate_function: XBackward0``) carries the sequence number of the forward op
that made it, and so inherits that op's part. Everything else — residual adds, the loss,
``AccumulateGrad`` — is **other**. Each event's *self* time is counted once, so the parts add up to
the total. The same grouping reads a saved Chrome trace (:func:`read_trace`, :func:`timeline`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .translation import N_
from .translation import gettext as _

__all__ = ["PARTS", "PREFIX", "Span", "PartTimes", "label_parts", "spans_of", "read_trace", "part_times", "allocated_by_part",
           "classify", "timeline", "op_dtypes", "DTYPE_NAMES", "COMPUTE_OPS"]

PARTS = (N_("QKV projection"), N_("scores"), N_("softmax"), N_("weights @ V"), N_("output projection"), N_("FFN"), N_("norms"),
         N_("fused attention"), N_("other"))
PREFIX = "tinytf::"  # the record_function ranges of label_parts
ATTENTION = "attention"  # the attention core's range: split into scores / softmax / weights @ V
_BACKWARD = "autograd::engine::evaluate_function: "
_SOFTMAX = ("aten::softmax", "aten::_softmax", "aten::_safe_softmax")
# the aten ops that do a Transformer LM's arithmetic (what op_dtypes reports by default), in the order they run
COMPUTE_OPS = ("aten::embedding", "aten::native_layer_norm", "aten::addmm", "aten::mm", "aten::bmm", "aten::mul", "aten::_softmax",
               "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention",
               "aten::_scaled_dot_product_efficient_attention", "aten::gelu", "aten::add", "aten::_log_softmax",
               "aten::nll_loss_forward")
DTYPE_NAMES = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16", "double": "fp64", "bool": "bool", "long int": "int64",
               "int": "int32"}


@dataclass(eq=False)
class Span:
    """One profiler event: name, start and end (µs), the autograd sequence number (-1: none), its own
    (self) time and bytes, and its place in the call tree."""

    name: str
    start: float
    end: float
    seq: int = -1
    self_time: float = 0.0
    self_bytes: int = 0
    parent: Span | None = None
    children: list[Span] = field(default_factory=list)
    dtypes: tuple[str, ...] = ()

    def ancestors(self) -> Iterator[Span]:
        """This span, then its parent, its parent's parent, …"""
        node: Span | None = self
        while node is not None:
            yield node
            node = node.parent


@contextmanager
def label_parts(model: nn.Module) -> Iterator[nn.Module]:
    """Wrap each Transformer block's parts of ``model`` (a block, or a model holding blocks) in
    ``record_function`` ranges for the profiler; the hooks are removed on exit."""
    parts = {"norm1": "norms", "norm2": "norms", "attn": ATTENTION, "attn.qkv": "QKV projection",
             "attn.proj": "output projection", "ffn": "FFN"}
    handles, found = [], 0
    for _name, block in model.named_modules():
        if not all(hasattr(block, a) for a in ("norm1", "norm2", "attn", "ffn")):
            continue
        found += 1
        for path, part in parts.items():
            handles += _hook(block.get_submodule(path), PREFIX + part)
    if not found:
        raise ValueError(_("label_parts found no Transformer block in {model} (a module with norm1, attn, norm2 and ffn)")
                         .format(model=type(model).__name__))
    try:
        yield model
    finally:
        for h in handles:
            h.remove()


def _hook(module: nn.Module, label: str) -> list[Any]:
    open_ranges: list[Any] = []

    def enter(_module: nn.Module, _args: Any) -> None:
        rf = torch.profiler.record_function(label)
        rf.__enter__()
        open_ranges.append(rf)

    def leave(_module: nn.Module, _args: Any, _out: Any) -> None:
        open_ranges.pop().__exit__(None, None, None)

    return [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]


def spans_of(events: Iterable[Any], *, device: bool = False) -> list[Span]:
    """:class:`Span` of each of torch.profiler's ``FunctionEvent`` (``prof.events()``): CPU self time and bytes,
    or the device's (``device=True``: CUDA kernels' time, attributed to the op that launched them)."""
    events = [e for e in events if getattr(e, "device_type", None) in (None, torch.autograd.DeviceType.CPU)]
    spans = {id(e): Span(e.name, e.time_range.start, e.time_range.end, e.sequence_nr,
                         e.self_device_time_total if device else e.self_cpu_time_total,
                         e.self_device_memory_usage if device else e.self_cpu_memory_usage,
                         dtypes=_tensor_dtypes(e)) for e in events}
    for e in events:
        if e.cpu_parent is not None and id(e.cpu_parent) in spans:
            _link(spans[id(e)], spans[id(e.cpu_parent)])
    return list(spans.values())


def _tensor_dtypes(e: Any) -> tuple[str, ...]:
    """The dtypes of an event's tensor inputs (a Python number shows as ``double`` with an empty shape: skipped)."""
    shapes = e.input_shapes or ()
    return tuple(DTYPE_NAMES.get(t, t) for t, shape in zip(e.input_dtypes or (), shapes) if isinstance(shape, list) and shape)


def _link(child: Span, parent: Span) -> None:
    child.parent = parent
    parent.children.append(child)


def read_trace(path: str | Path) -> list[Span]:
    """The CPU ops and ranges of a Chrome trace written by ``prof.export_chrome_trace(path)``, as :class:`Span`
    (the call tree rebuilt from time containment on each thread; self time = duration minus the children's)."""
    events = json.loads(Path(path).read_text(encoding="utf-8"))["traceEvents"]
    spans: dict[tuple[Any, Any], list[Span]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation"):
            span = Span(e["name"], e["ts"], e["ts"] + e["dur"], e.get("args", {}).get("Sequence number", -1))
            spans.setdefault((e["pid"], e["tid"]), []).append(span)
    out: list[Span] = []
    for thread in spans.values():
        thread.sort(key=lambda s: (s.start, -s.end))
        stack: list[Span] = []
        for s in thread:
            while stack and stack[-1].end < s.end:
                stack.pop()
            if stack:
                _link(s, stack[-1])
            stack.append(s)
        for s in thread:
            s.self_time = (s.end - s.start) - sum(c.end - c.start for c in s.children)
        out += thread
    return out


def _softmax_of(container: Span) -> Span | None:
    """The first softmax op inside an attention range (not inside a nested labelled range)."""
    todo, found = list(container.children), []
    while todo:
        s = todo.pop()
        if s.name.startswith(PREFIX):
            continue
        if s.name in _SOFTMAX:
            found.append(s)
        else:
            todo += s.children
    return min(found, key=lambda s: s.start) if found else None


def classify(spans: list[Span]) -> dict[Span, tuple[str, str]]:
    """``{span: (phase, part)}``: phase ``"forward"`` or ``"backward"``, part one of :data:`PARTS` (an attention
    range itself gets the part ``"attention"``: its self time is split by :func:`part_times`)."""
    out: dict[Span, tuple[str, str]] = {}
    softmax = {s: _softmax_of(s) for s in spans if s.name == PREFIX + ATTENTION}
    seq_part: dict[int, str] = {}
    for s in sorted(spans, key=lambda s: s.start):
        if any(a.name.startswith(_BACKWARD) for a in s.ancestors()):
            continue
        label = next((a for a in s.ancestors() if a.name.startswith(PREFIX)), None)
        part = "other" if label is None else label.name.removeprefix(PREFIX)
        if part == ATTENTION and label is not s:
            part = _attention_part(s, softmax[label])
        out[s] = ("forward", part)
        if s.seq >= 0 and part != ATTENTION:
            seq_part.setdefault(s.seq, part)
    for s in spans:
        if s not in out:
            node = next(a for a in s.ancestors() if a.name.startswith(_BACKWARD))
            out[s] = ("backward", seq_part.get(node.seq, "other"))
    return out


def _attention_part(s: Span, sm: Span | None) -> str:
    if sm is None:
        return "fused attention"
    if any(a is sm for a in s.ancestors()):
        return "softmax"
    return "scores" if s.start < sm.start else "weights @ V"


@dataclass
class PartTimes:
    """Self time (µs) per part of :data:`PARTS`, forward and backward; ``total`` is the sum of every event's self
    time, which the parts add up to."""

    forward: dict[str, float]
    backward: dict[str, float]
    total: float

    def part(self, name: str) -> float:
        """Forward + backward µs of one part."""
        return self.forward[name] + self.backward[name]

    def per_call(self, calls: int) -> PartTimes:
        """The same times divided by ``calls`` (a profile of several identical steps, read per step)."""
        return PartTimes({p: t / calls for p, t in self.forward.items()}, {p: t / calls for p, t in self.backward.items()},
                         self.total / calls)

    def table(self, lang: str | None = None) -> str:
        """A plain-text table: each part's forward, backward and total ms and its share of the total."""
        words = [_("part", lang), _("forward ms", lang), _("backward ms", lang), _("total ms", lang), _("share", lang), _("total", lang)]
        rows = [f"{words[0]:<20}{words[1]:>12}{words[2]:>13}{words[3]:>10}{words[4]:>8}"]
        for p in PARTS:
            if self.part(p) == 0:
                continue
            rows.append(f"{_(p, lang):<20}{self.forward[p] / 1e3:>12.2f}{self.backward[p] / 1e3:>13.2f}{self.part(p) / 1e3:>10.2f}"
                        f"{self.part(p) / self.total:>8.1%}")
        fwd, bwd = sum(self.forward.values()), sum(self.backward.values())
        rows.append(f"{words[5]:<20}{fwd / 1e3:>12.2f}{bwd / 1e3:>13.2f}{self.total / 1e3:>10.2f}{1:>8.0%}")
        return "\n".join(rows)


def _spans(events: Iterable[Any] | list[Span], device: bool = False) -> list[Span]:
    return events if isinstance(events, list) and all(isinstance(s, Span) for s in events) else spans_of(events, device=device)


def part_times(events: Iterable[Any] | list[Span], *, device: bool = False) -> PartTimes:
    """Group the self time of profiler events (``prof.events()``, or :func:`read_trace`'s spans) by phase and part.
    An attention range's own time — Python between its ops — goes to the scores or to weights @ V by where it
    was spent, before or after the softmax."""
    spans = _spans(events, device)
    sums: dict[str, dict[str, float]] = {"forward": dict.fromkeys(PARTS, 0.0), "backward": dict.fromkeys(PARTS, 0.0)}
    for s, (phase, part) in classify(spans).items():
        if part != ATTENTION:
            sums[phase][part] += s.self_time
            continue
        for p, share in _split_attention_gaps(s).items():
            sums[phase][p] += s.self_time * share
    return PartTimes(sums["forward"], sums["backward"], sum(s.self_time for s in spans))


def allocated_by_part(events: Iterable[Any] | list[Span], *, device: bool = False) -> tuple[dict[str, int], int]:
    """From a forward recorded with ``profile_memory=True``: the bytes each part's ops allocated (frees not
    subtracted), and the net bytes every event together left allocated — the forward's output plus everything
    it saved for backward (what chapter 05's ledger predicts), less what was allocated before the profile."""
    spans = _spans(events, device)
    parts = dict.fromkeys(PARTS, 0)
    for s, (_phase, part) in classify(spans).items():
        if part != ATTENTION and s.self_bytes > 0 and not s.name.startswith(PREFIX):
            parts[part] += s.self_bytes
    return parts, sum(s.self_bytes for s in spans)


def _split_attention_gaps(container: Span) -> dict[str, float]:
    """Shares of an attention range's own time: its gaps between children before / after the softmax."""
    sm = _softmax_of(container)
    if sm is None:
        return {"fused attention": 1.0}
    edges, before, after = container.start, 0.0, 0.0
    for c in sorted(container.children, key=lambda c: c.start):
        gap = max(0.0, c.start - edges)
        before, after = (before + gap, after) if c.start <= sm.start else (before, after + gap)
        edges = max(edges, c.end)
    after += max(0.0, container.end - edges)
    total = before + after
    return {"scores": before / total, "weights @ V": after / total} if total > 0 else {"scores": 1.0}


def timeline(spans: list[Span]) -> list[tuple[str, str, float, float]]:
    """``(phase, part, start, end)`` (µs from the first span) of the bars a timeline draws: the spans whose part
    differs from their parent's (an attention range is drawn as its scores, softmax and weights @ V), one bar for
    each run of consecutive spans of the same phase and part."""
    parts = classify(spans)
    t0 = min(s.start for s in spans)
    tops = sorted((s for s, (phase, part) in parts.items() if part != ATTENTION and (s.parent is None or parts[s.parent] != parts[s])),
                  key=lambda s: s.start)
    bars: list[tuple[str, str, float, float]] = []
    for s in tops:
        phase, part = parts[s]
        if bars and bars[-1][:2] == (phase, part):
            bars[-1] = (phase, part, bars[-1][2], max(bars[-1][3], s.end - t0))
        else:
            bars.append((phase, part, s.start - t0, s.end - t0))
    return bars


def op_dtypes(events: Iterable[Any] | list[Span], names: Iterable[str] = COMPUTE_OPS) -> dict[str, Counter]:
    """``{op: Counter(input dtypes)}`` of the forward ops named in ``names`` at any depth — the ops that do the
    work, after autocast has cast their inputs (``aten::linear`` itself still sees fp32; the ``aten::addmm`` it
    calls sees what really runs) — read from a profile recorded with ``record_shapes=True``."""
    spans = _spans(events)
    wanted = list(names)
    table: dict[str, Counter] = {}
    for s, (phase, _part) in classify(spans).items():
        if phase == "forward" and s.name in wanted:
            table.setdefault(s.name, Counter())[s.dtypes] += 1
    return {name: table[name] for name in wanted if name in table}
