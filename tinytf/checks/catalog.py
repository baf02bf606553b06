"""The pitfall catalog: the one place that names, teaches and fixes each classic mistake.

Chapter 08's "at a glance" table, every ``diagnose_*`` finding, ``tinytf validate`` and the
exercises' feedback read from here. Refer to a pitfall by name (``Pitfall.SCALE``), never by a
bare number; the numbers are the article's list (chapter 08's sections, 1-14), kept for readers, then
chapter 10's tiled-attention pitfalls (15-18), chapter 11's smaller-KV-cache pitfalls (19-20), chapter 12's
pitfalls of attention split across processes (21-29), chapter 13's pitfalls of positions (30-36) and chapter
14's of half precision, loss scaling and compiled timings (40-44).
``glance_table()`` lists one chapter's pitfalls (chapter 08's fourteen by default); ``catalog_markdown()`` every
chapter's, under a heading each (the book's pitfall page; chapter 08 lists the later chapters' with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from ..translation import N_, current_language
from ..translation import gettext as _

__all__ = ["Pitfall", "Entry", "CATALOG", "PITFALLS", "glance_table", "chapters_with_pitfalls", "catalog_markdown"]


class Pitfall(IntEnum):
    """A classic mistake; ``int(p)`` is its number: 1-14 in chapter 08, 15-18 in chapter 10 (tiled attention),
    19-20 in chapter 11 (smaller KV caches), 21-29 in chapter 12 (attention across processes), 30-36 in chapter 13
    (positions: RoPE, ALiBi), 40-44 in chapter 14 (precision and profiling), 0 = a general problem that is none of them."""

    GENERAL = 0
    SCALE = 1
    ORIENTATION = 2
    MASK = 3
    CAUSAL_OFF_BY_ONE = 4
    HEADS_DIVIDE = 5
    VIEW_AFTER_TRANSPOSE = 6
    BATCH_NORM = 7
    RESIDUAL_SHAPE = 8
    TRAIN_EVAL = 9
    EXPLICIT_IN_PRODUCTION = 10
    KV_CACHE = 11
    COLD_TIMING = 12
    UNSHIFTED_TARGETS = 13
    PADDING_IN_LOSS = 14
    ACC_NOT_RESCALED = 15
    NO_FINAL_DIVISION = 16
    MASKED_TILE_NAN = 17
    DIAGONAL_TILE_SKIPPED = 18
    KV_GROUPING = 19
    WINDOW_OFF_BY_ONE = 20
    FORGOTTEN_ALL_REDUCE = 21
    QKV_SPLIT_ONE_PIECE = 22
    BIAS_BEFORE_ALL_REDUCE = 23
    RING_LOCAL_OFFSET = 24
    DROPOUT_RNG_UNSYNCED = 25
    ULYSSES_AXES_SWAPPED = 26
    RING_BUFFER_REUSED = 27
    SP_GRADS_NOT_REDUCED = 28
    KV_EXPANDED_BEFORE_RING = 29
    ROPE_LAYOUT = 30
    ROPE_ON_V = 31
    DECODE_AT_ZERO = 32
    KEYS_ROTATED_TWICE = 33
    LOW_PRECISION_ANGLES = 34
    LEFT_PAD_OFFSET = 35
    ALIBI_BIAS = 36
    UNSCALED_HALF_SCORES = 40
    HALF_SOFTMAX_NO_MAX = 41
    EMPTY_ROW_INF_MASK = 42
    FP16_NO_GRAD_SCALER = 43
    COMPILED_FIRST_CALL = 44

    @property
    def entry(self) -> Entry:
        return CATALOG[self]

    @property
    def title(self) -> str:
        return CATALOG[self].title

    @property
    def fix(self) -> str:
        return CATALOG[self].fix

    def label(self, lang: str | None = None) -> str:
        """``"pitfall 1 (missing or wrong 1/sqrt(d_head) scaling)"``; ``"problem"`` for GENERAL; in ``lang``
        (default: the running notebook's language)."""
        if self is Pitfall.GENERAL:
            return _("problem", lang)
        return _("pitfall {number} ({title})", lang).format(number=int(self), title=_(CATALOG[self].title, lang))


@dataclass(frozen=True)
class Entry:
    """One row of the catalog: names, where it is taught, its symptom, detector and one-line fix.

    Written in English; the message catalog (:mod:`tinytf.translation`) holds each one's Chinese
    (``title_zh``, ``symptom_zh``, ``fix_zh``, ``detector_zh``)."""

    title: str
    short: str  # the table's "pitfall" column (markdown)
    section: str  # the chapter section that teaches it
    symptom: str
    detector: str
    fix: str

    @property
    def title_zh(self) -> str:
        return _(self.title, "zh")

    @property
    def symptom_zh(self) -> str:
        return _(self.symptom, "zh")

    @property
    def fix_zh(self) -> str:
        return _(self.fix, "zh")

    @property
    def detector_zh(self) -> str:
        return _(self.detector, "zh")


_S = "08_pitfalls.ipynb § Pitfall "
_T = "10_tiled_attention.ipynb § "
_K = "11_smaller_kv_caches.ipynb § "
_P = "12_attention_across_processes.ipynb § "
_R = "13_positions.ipynb § 9. Pitfalls"
_H = "14_precision_and_profiling.ipynb § "
CATALOG: dict[Pitfall, Entry] = {
    Pitfall.GENERAL: Entry(
        N_("general problem (none of the named pitfalls)"), "general problem", "09_exercises.ipynb",
        N_("the code raised, returned the wrong type or changed its inputs"), N_("every diagnose_*"),
        N_("read the message: it names the input and what differs")),
    Pitfall.SCALE: Entry(
        N_("missing or wrong 1/sqrt(d_head) scaling"), "no `1/sqrt(d_head)` (or `1/sqrt(D)`)", _S + "1",
        N_("softmax sharpens as heads widen"), "`diagnose_attention`", N_("divide by `sqrt(q.size(-1))`")),
    Pitfall.ORIENTATION: Entry(
        N_("q @ kᵀ orientation / shape contract"), "`k @ qᵀ` / wrong axis", _S + "2",
        N_("crash when `Tq ≠ Tk`, wrong numbers when square"), "`diagnose_attention`",
        N_("`q @ k.transpose(-2, -1)`, softmax over keys")),
    Pitfall.MASK: Entry(
        N_("mask after softmax, ignored or inverted"), "mask after softmax / ignored / inverted", _S + "3",
        N_("rows sum to < 1, padding gets weight"), "`diagnose_attention`",
        N_("`masked_fill(~mask, -inf)` before softmax, True = may attend")),
    Pitfall.CAUSAL_OFF_BY_ONE: Entry(
        N_("causal mask off by one / future leak"), "causal mask off by one", _S + "4", N_("NaN row 0, or a peek at the next token"),
        "`diagnose_causal_mask`, `diagnose_block`", N_("`ones(T, T).tril()`")),
    Pitfall.HEADS_DIVIDE: Entry(
        N_("dim not divisible by heads"), "`dim % heads != 0`", _S + "5", N_("split fails"), N_("none: tinytf raises `ValueError`"),
        N_("pick heads dividing `dim`")),
    Pitfall.VIEW_AFTER_TRANSPOSE: Entry(
        N_("view after transpose"), "`view` after `transpose`", _S + "6", N_("`RuntimeError`, or silent head/position mix"),
        N_("none (the silent form shows up as a leak in `diagnose_block`)"), N_("transpose back, then `reshape`")),
    Pitfall.BATCH_NORM: Entry(
        N_("BatchNorm instead of LayerNorm"), "BatchNorm for LayerNorm", _S + "7",
        N_("output depends on other sequences; train ≠ eval"), "`diagnose_block`", N_("`nn.LayerNorm(D)`")),
    Pitfall.RESIDUAL_SHAPE: Entry(
        N_("residual changes the shape"), "residual changes shape", _S + "8", N_("shape error at `x + branch(x)`"), "`diagnose_block`",
        N_("FFN projects back to `D`")),
    Pitfall.TRAIN_EVAL: Entry(
        N_("train() / eval() / no_grad confusion"), "train/eval/no_grad", _S + "9", N_("eval output random; no_grad keeps dropout"),
        "`diagnose_block`", N_("`nn.Dropout`, `model.eval()`")),
    Pitfall.EXPLICIT_IN_PRODUCTION: Entry(
        N_("hand-written attention in production"), "explicit attention in production", _S + "10", N_("`T²` memory saved for backward"),
        N_("none: measure"), N_("fused `F.scaled_dot_product_attention`")),
    Pitfall.KV_CACHE: Entry(
        N_("KV-cache misconceptions"), "KV-cache misconceptions", _S + "11",
        N_("cache memory grows with `B · T`; steps still read all of it"), N_("none: measure"), N_("budget it, measure the speed-up")),
    Pitfall.COLD_TIMING: Entry(
        N_("first-run CPU timing"), "first-run timing", _S + "12", N_("first call ≫ warm calls"), N_("none: measure"),
        N_("warm up, synchronise, median, conditions")),
    Pitfall.UNSHIFTED_TARGETS: Entry(
        N_("LM targets not shifted"), "targets not shifted", _S + "13", N_("loss near zero, model only copies"), "`diagnose_lm_loss`",
        N_("`logits[:, :-1]` vs `ids[:, 1:]`")),
    Pitfall.PADDING_IN_LOSS: Entry(
        N_("padding counted in the loss"), "padding in the loss", _S + "14", N_("loss changes when padding is added"),
        "`diagnose_lm_loss`", N_("`ignore_index=pad_id`, divide by real tokens")),
    Pitfall.ACC_NOT_RESCALED: Entry(
        N_("accumulator not rescaled when the running maximum grows"), "`acc` (or `l`) not rescaled by `exp(m - m_new)`",
        _T + "2. The online softmax", N_("right while the first tile holds each row's maximum, wrong once a later tile raises it"),
        "`diagnose_online_softmax`, `diagnose_tiled_attention`",
        N_("`alpha = exp(m - m_new)`; `l = alpha * l + p.sum(-1)`, `acc = alpha * acc + p @ v`")),
    Pitfall.NO_FINAL_DIVISION: Entry(
        N_("the division by l forgotten, or done per tile"), "`acc / l` missing or inside the tile loop", _T + "2. The online softmax",
        N_("with v = ones the rows are not ones; right with one key tile only when done per tile"), "`diagnose_tiled_attention`",
        N_("divide `acc / l` once, after the last key tile")),
    Pitfall.MASKED_TILE_NAN: Entry(
        N_("NaN from a tile whose every entry is masked (-inf - -inf)"), "`exp(-inf - -inf)` in a fully masked tile or row",
        _T + "3. Tiles of q against tiles of k and v",
        N_("NaN rows when a row's first key tile is all masked, or the row may see nothing"),
        "`diagnose_online_softmax`, `diagnose_tiled_attention`",
        N_("subtract `m_new.masked_fill(m_new == -inf, 0)`; divide by `l` only where `l > 0`")),
    Pitfall.DIAGONAL_TILE_SKIPPED: Entry(
        N_("the diagonal tile skipped under a causal mask"), "causal skipping drops the diagonal tile", _T + "4. A causal mask",
        N_("a query never reads its own key (row 0 empty: zeros or NaN)"), "`diagnose_causal_tiles`",
        N_("skip only key blocks starting at or after `Tk - Tq + q1`; mask inside the diagonal tile")),
    Pitfall.KV_GROUPING: Entry(
        N_("query heads mapped to the wrong K/V heads: repeat vs repeat_interleave"),
        "`repeat` (k0 k1 k0 k1) where `repeat_interleave` (k0 k0 k1 k1) is meant, or the reverse",
        _K + "2. Fewer K/V heads: multi-query and grouped-query",
        N_("shapes fine, outputs differ; right only when kv_heads is 1 or heads"), "`diagnose_kv_grouping`, `diagnose_expand_kv`",
        N_("query head `h` reads K/V head `h // (heads // kv_heads)`: `kv.repeat_interleave(heads // kv_heads, dim=1)`")),
    Pitfall.WINDOW_OFF_BY_ONE: Entry(
        N_("sliding window off by one: window + 1 or window - 1 keys per query"), "window lets a query see `window ± 1` keys",
        _K + "6. The sliding window and its rolling buffer",
        N_("a query sees one key too many or too few; the window counts the query itself"), "`diagnose_window`",
        N_("the query at position `p` sees keys `p - window + 1 … p`: `causal_mask(t_q, t_k, window=window)`")),
    Pitfall.FORGOTTEN_ALL_REDUCE: Entry(
        N_("the forgotten all-reduce: each rank holds a partial sum"), "row-parallel output used without its all-reduce",
        _P + "10. What breaks", N_("the ranks' outputs differ from each other and from one process; their sum is right"),
        "`diagnose_row_parallel`", N_("all-reduce the row-parallel partial sums (`reduce_from_parallel`), then add the bias")),
    Pitfall.QKV_SPLIT_ONE_PIECE: Entry(
        N_("the fused QKV weight split in one piece"), "`qkv.weight.chunk(P)[r]` instead of per Q/K/V and per head",
        _P + "2. Tensor-parallel attention", N_("right shapes, wrong heads: a rank gets Q rows of some heads and K rows of others"),
        "`diagnose_qkv_split`", N_("take rank r's heads from each of W_q, W_k and W_v: `shard_qkv(weight, r, P, heads, kv_heads)`")),
    Pitfall.BIAS_BEFORE_ALL_REDUCE: Entry(
        N_("the output-projection bias added on every rank before the all-reduce"), "row-parallel bias added before the sum",
        _P + "10. What breaks", N_("the output is off by exactly (P - 1) · bias on every rank"), "`diagnose_row_parallel`",
        N_("add the row-parallel bias once, after the all-reduce")),
    Pitfall.RING_LOCAL_OFFSET: Entry(
        N_("ring attention without the global causal offset"), "each arriving K/V block masked as if it started at 0",
        _P + "5. Ring attention", N_("rank 0 sees the future, later ranks lose half of their past"), "`diagnose_ring_attention`",
        N_("mask with global positions: key j is seen by query i iff position(j) <= position(i)")),
    Pitfall.DROPOUT_RNG_UNSYNCED: Entry(
        N_("dropout with unsynchronised RNG across tensor-parallel ranks"), "residual dropout seeded differently per rank",
        _P + "10. What breaks", N_("activations that every rank should hold identically drift apart"), "`diagnose_replicated`",
        N_("seed the RNG identically on the tensor-parallel ranks for dropout on replicated tensors")),
    Pitfall.ROPE_LAYOUT: Entry(
        N_("RoPE's layout mixed up: interleaved pairs where half-split ones are meant, or the reverse"),
        "interleaved pairs `(2i, 2i+1)` vs half-split `(i, i+r/2)`", _R,
        N_("no error, fluent garbage: the weights were trained with the other pairing"), "`diagnose_rope`",
        N_("use the layout the weights were trained with, or permute W_q and W_k inside each head (`to_half_split`)")),
    Pitfall.ROPE_ON_V: Entry(
        N_("v rotated: RoPE applied to the values"), "RoPE on `v`", _R,
        N_("outputs drift with the absolute position; relative positions no longer cancel"), "`diagnose_rope_decode`",
        N_("rotate q and k only; v stays as projected")),
    Pitfall.DECODE_AT_ZERO: Entry(
        N_("a decode step rotated at position 0 instead of its absolute position"), "decode query (or key) rotated at 0, not `past`",
        _R, N_("cached generation differs from recomputation from the first decoded token on"), "`diagnose_rope`, `diagnose_rope_decode`",
        N_("rotate the new tokens at positions past … past + t - 1 (past = tokens already cached)")),
    Pitfall.KEYS_ROTATED_TWICE: Entry(
        N_("cached keys rotated twice, or rotated only after caching"), "cached keys rotated again on every step", _R,
        N_("right for the prompt, wrong once keys come back out of the cache"), "`diagnose_rope_decode`",
        N_("rotate each key once, at its absolute position, before it is written to the cache")),
    Pitfall.LOW_PRECISION_ANGLES: Entry(
        N_("RoPE angles computed in bf16 or fp16"), "angles `position · θ` in bf16/fp16", _R,
        N_("right for short sequences, whole radians off at position ~4096"), "`diagnose_rope`",
        N_("build position · θ, cos and sin in float32; cast only the tables to the model's dtype")),
    Pitfall.LEFT_PAD_OFFSET: Entry(
        N_("positions counted from the pads of a left-padded batch"), "left pads shift the positions of the real tokens", _R,
        N_("a short sequence gives other logits in a padded batch than alone (learned or sinusoidal positions)"),
        "`diagnose_padded_positions`",
        N_("number each row's real tokens 0, 1, 2 … from its first real token (`padded_positions`)")),
    Pitfall.ALIBI_BIAS: Entry(
        N_("ALiBi's bias with the wrong sign, slopes or alignment"), "ALiBi bias `+m·d`, wrong slopes, or start-aligned", _R,
        N_("far keys favoured, heads with the wrong reach, or a decode step biased as if at position 0"), "`diagnose_alibi`",
        N_("bias[h, i, j] = -m_h · (p_i - j) with p_i = t_k - t_q + i and m_h = 2^(-8(h+1)/H)")),
    Pitfall.UNSCALED_HALF_SCORES: Entry(
        N_("fp16 scores overflow: 1/sqrt(d) applied after q @ kᵀ, or not at all"), "fp16 `q @ kᵀ` before its `1/sqrt(d)`",
        _H + "2. Scores that overflow", N_("inf scores and NaN weights at activation scales a fused kernel survives"),
        "`diagnose_half_attention`", N_("scale q before the product: `(q * d**-0.5) @ k.transpose(-2, -1)`, or form the scores in fp32")),
    Pitfall.HALF_SOFTMAX_NO_MAX: Entry(
        N_("softmax without subtracting the row maximum in half precision"), "`exp(s) / exp(s).sum()` in fp16",
        _H + "3. A softmax without the max", N_("NaN weights once a score passes ln(65504) = 11.09"), "`diagnose_half_attention`",
        N_("subtract the row maximum first: `torch.softmax`, or `(s - s.amax(-1, keepdim=True)).exp()`")),
    Pitfall.EMPTY_ROW_INF_MASK: Entry(
        N_("a -inf additive mask meets a fully masked row"), "`-inf` mask on a row that may see nothing",
        _H + "4. Masks", N_("NaN rows, and NaN gradients for every key even when the loss ignores those rows"), "`diagnose_masked_rows`",
        N_("give a row that may see nothing zero weights (`allowed.any(-1)`), as tinytf and `F.scaled_dot_product_attention` do")),
    Pitfall.FP16_NO_GRAD_SCALER: Entry(
        N_("fp16 training without a GradScaler: gradients underflow to zero"), "fp16 autocast without `GradScaler`",
        _H + "6. A mixed-precision training step", N_("gradient entries exactly zero in fp16 that are not in fp32, more as the loss falls"),
        "`diagnose_grad_underflow`", N_("`torch.amp.GradScaler`: `scaler.scale(loss).backward()`, `scaler.step(opt)`, `scaler.update()`")),
    Pitfall.COMPILED_FIRST_CALL: Entry(
        N_("timing a compiled model including its first call"), "the compile timed as a call", _H + "8. torch.compile, measured",
        N_("first call seconds, the others milliseconds; the mean is mostly compile time"), "`diagnose_timings`",
        N_("warm up before timing (`tinytf.benchmark(warmup=...)`) and report the compile time apart")),
    Pitfall.ULYSSES_AXES_SWAPPED: Entry(
        N_("Ulysses' all-to-all with the sequence and head axes swapped"), "received chunks laid along the heads, not the sequence",
        _P + "7. Ulysses", N_("right shapes, wrong rows: each rank's positions attend only to their own block"), "`diagnose_ulysses`",
        N_("split dim 1 (the heads) into P chunks to send, and join the received chunks along dim 2 (the sequence) in rank order; "
           "the output goes back the inverse way")),
    Pitfall.RING_BUFFER_REUSED: Entry(
        N_("a ring buffer reused before its wait"), "receive into the block being computed or sent, or read it before `wait()`",
        _P + "9. Hiding the ring's transfers", N_("right or wrong depending on when the data arrives"), "`diagnose_overlapped_ring`",
        N_("two buffers: compute with one while the other receives; swap them only after `wait()`; never receive into k, v kept "
           "for the backward")),
    Pitfall.SP_GRADS_NOT_REDUCED: Entry(
        N_("LayerNorm gradients not all-reduced under sequence parallelism"), "replicated weights' gradients left partial",
        _P + "3. Sequence parallelism", N_("exact forward; each rank's LayerNorm and bias gradients cover its positions only, and "
                                           "the copies drift apart after a step"), "`diagnose_replicated_grads`",
        N_("all-reduce the gradients of the parameters every rank holds whole (`reduce_replicated_grads`) before the step")),
    Pitfall.KV_EXPANDED_BEFORE_RING: Entry(
        N_("K/V heads expanded before the ring"), "`repeat_kv` before `ring_attention`",
        _P + "6. Grouped-query K/V", N_("exact results, heads / kv_heads times the bytes"), "`diagnose_ring_traffic`",
        N_("pass the narrow k, v [B, kv_heads, T/P, d] to the ring: each query head meets its K/V head on arrival")),
}

# number -> title, for code that still holds a plain int (e.g. findings read back from JSON)
PITFALLS: dict[int, str] = {int(p): e.title for p, e in CATALOG.items()}


def glance_table(lang: str | None = None, *, chapter: str | None = "08") -> str:
    """The "at a glance" table of the pitfalls that chapter ``chapter`` teaches, as markdown: chapter 08's
    fourteen by default, ``chapter="10"`` for tiled attention's, ``chapter="11"`` for smaller KV caches',
    ``chapter="12"`` for attention across processes', ``chapter="13"`` for positions', ``chapter="14"`` for precision
    and profiling; ``chapter=None``: every chapter's.
    In English or Chinese (``"zh"``); by default in the running notebook's language
    (:func:`tinytf.language.notebook_language`)."""
    lang = current_language(lang)
    chosen = [(p, e) for p, e in CATALOG.items() if p and (chapter is None or e.section.startswith(f"{chapter}_"))]
    columns = [_("pitfall", lang), _("symptom", lang), _("detector", lang), _("fix", lang)]
    head = "| # | " + " | ".join(columns) + " |\n|---|---|---|---|---|"
    # English names a pitfall by its short form (markdown); Chinese by its title
    rows = [f"| {int(p)} | {_(e.title, lang) if lang != 'en' else e.short} | {_(e.symptom, lang)} | {_(e.detector, lang)} "
            f"| {_(e.fix, lang)} |" for p, e in chosen]
    return "\n".join([head, *rows])


def chapters_with_pitfalls() -> list[str]:
    """The chapters (``"08"``, ``"10"``, …) whose sections teach a named pitfall, in order."""
    return sorted({e.section[:2] for p, e in CATALOG.items() if p})


def catalog_markdown(lang: str | None = None, *, after: str | None = None, level: int = 3) -> str:
    """Every chapter's :func:`glance_table` under a heading of ``level`` naming the chapter's notebook, in order; with
    ``after="08"`` only the chapters after 08 (chapter 08 lists the later chapters' pitfalls below its own table)."""
    lang = current_language(lang)
    parts = []
    for chapter in chapters_with_pitfalls():
        if after is not None and chapter <= after:
            continue
        notebook = next(e.section.split(" § ")[0] for p, e in CATALOG.items() if p and e.section.startswith(f"{chapter}_"))
        heading = _("Chapter {number}: `{notebook}`", lang).format(number=chapter, notebook=notebook)
        parts.append(f"{'#' * level} {heading}\n\n{glance_table(lang, chapter=chapter)}")
    return "\n\n".join(parts)
