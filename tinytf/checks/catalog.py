"""The pitfall catalog: the one place that names, teaches and fixes each classic mistake.

Chapter 08's "at a glance" table, every ``diagnose_*`` finding, ``tinytf validate`` and the
exercises' feedback read from here. Refer to a pitfall by name (``Pitfall.SCALE``), never by a
bare number; the numbers are the article's list (chapter 08's sections, 1-14), kept for readers, then
chapter 10's tiled-attention pitfalls (15-18), chapter 11's smaller-KV-cache pitfalls (19-20) and chapter 12's
pitfalls of attention split across processes (21-25).
``glance_table()`` lists one chapter's pitfalls (chapter 08's fourteen by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from ..language import notebook_language

__all__ = ["Pitfall", "Entry", "CATALOG", "PITFALLS", "glance_table"]


class Pitfall(IntEnum):
    """A classic mistake; ``int(p)`` is its number: 1-14 in chapter 08, 15-18 in chapter 10 (tiled attention),
    19-20 in chapter 11 (smaller KV caches), 21-25 in chapter 12 (attention across processes), 0 = a general
    problem that is none of them."""

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

    @property
    def entry(self) -> Entry:
        return CATALOG[self]

    @property
    def title(self) -> str:
        return CATALOG[self].title

    @property
    def fix(self) -> str:
        return CATALOG[self].fix

    def label(self, lang: str = "en") -> str:
        """``"pitfall 1 (missing or wrong 1/sqrt(d_head) scaling)"``; ``"problem"`` for GENERAL."""
        e = CATALOG[self]
        if self is Pitfall.GENERAL:
            return "问题" if lang == "zh" else "problem"
        if lang == "zh":
            return f"陷阱 {int(self)}（{e.title_zh}）"
        return f"pitfall {int(self)} ({e.title})"


@dataclass(frozen=True)
class Entry:
    """One row of the catalog: names, where it is taught, its symptom, detector and one-line fix."""

    title: str
    short: str  # the table's "pitfall" column (markdown)
    section: str  # the chapter section that teaches it
    symptom: str
    detector: str
    fix: str
    title_zh: str
    symptom_zh: str
    fix_zh: str


_S = "08_pitfalls.ipynb § Pitfall "
_T = "10_tiled_attention.ipynb § "
_K = "11_smaller_kv_caches.ipynb § "
_P = "12_attention_across_processes.ipynb § "
CATALOG: dict[Pitfall, Entry] = {
    Pitfall.GENERAL: Entry(
        "general problem (none of the named pitfalls)", "general problem", "09_exercises.ipynb",
        "the code raised, returned the wrong type or changed its inputs", "every diagnose_*",
        "read the message: it names the input and what differs",
        "一般问题（不属于任何已命名的陷阱）", "代码抛出异常、返回类型不对或修改了输入", "阅读提示：它会指出哪个输入、哪里不同"),
    Pitfall.SCALE: Entry(
        "missing or wrong 1/sqrt(d_head) scaling", "no `1/sqrt(d_head)` (or `1/sqrt(D)`)", _S + "1",
        "softmax sharpens as heads widen", "`diagnose_attention`", "divide by `sqrt(q.size(-1))`",
        "缺少或用错 1/sqrt(d_head) 缩放", "头越宽，softmax 越尖锐", "除以 `sqrt(q.size(-1))`"),
    Pitfall.ORIENTATION: Entry(
        "q @ kᵀ orientation / shape contract", "`k @ qᵀ` / wrong axis", _S + "2",
        "crash when `Tq ≠ Tk`, wrong numbers when square", "`diagnose_attention`",
        "`q @ k.transpose(-2, -1)`, softmax over keys",
        "q @ kᵀ 的方向或形状约定错误", "`Tq ≠ Tk` 时报错，方阵时数值悄悄出错", "`q @ k.transpose(-2, -1)`，在键的维度上做 softmax"),
    Pitfall.MASK: Entry(
        "mask after softmax, ignored or inverted", "mask after softmax / ignored / inverted", _S + "3",
        "rows sum to < 1, padding gets weight", "`diagnose_attention`",
        "`masked_fill(~mask, -inf)` before softmax, True = may attend",
        "掩码在 softmax 之后、被忽略或方向相反", "行和小于 1，填充位置分到权重",
        "在 softmax 之前 `masked_fill(~mask, -inf)`，True 表示可以关注"),
    Pitfall.CAUSAL_OFF_BY_ONE: Entry(
        "causal mask off by one / future leak", "causal mask off by one", _S + "4",
        "NaN row 0, or a peek at the next token", "`diagnose_causal_mask`, `diagnose_block`", "`ones(T, T).tril()`",
        "因果掩码差一位或泄漏未来", "第 0 行出现 NaN，或偷看下一个 token", "`ones(T, T).tril()`"),
    Pitfall.HEADS_DIVIDE: Entry(
        "dim not divisible by heads", "`dim % heads != 0`", _S + "5",
        "split fails", "none: tinytf raises `ValueError`", "pick heads dividing `dim`",
        "dim 不能被 heads 整除", "拆分多头时失败", "选择能整除 `dim` 的头数"),
    Pitfall.VIEW_AFTER_TRANSPOSE: Entry(
        "view after transpose", "`view` after `transpose`", _S + "6",
        "`RuntimeError`, or silent head/position mix", "none (the silent form shows up as a leak in `diagnose_block`)",
        "transpose back, then `reshape`",
        "transpose 之后直接 view", "`RuntimeError`，或悄悄混淆头与位置", "先转置回来，再 `reshape`"),
    Pitfall.BATCH_NORM: Entry(
        "BatchNorm instead of LayerNorm", "BatchNorm for LayerNorm", _S + "7",
        "output depends on other sequences; train ≠ eval", "`diagnose_block`", "`nn.LayerNorm(D)`",
        "用 BatchNorm 代替了 LayerNorm", "输出依赖批内其他序列；train 与 eval 不一致", "`nn.LayerNorm(D)`"),
    Pitfall.RESIDUAL_SHAPE: Entry(
        "residual changes the shape", "residual changes shape", _S + "8",
        "shape error at `x + branch(x)`", "`diagnose_block`", "FFN projects back to `D`",
        "残差分支改变了形状", "`x + branch(x)` 处形状报错", "前馈网络投影回 `D`"),
    Pitfall.TRAIN_EVAL: Entry(
        "train() / eval() / no_grad confusion", "train/eval/no_grad", _S + "9",
        "eval output random; no_grad keeps dropout", "`diagnose_block`", "`nn.Dropout`, `model.eval()`",
        "混淆 train() / eval() / no_grad", "eval 下输出随机；no_grad 下仍有 dropout", "`nn.Dropout`，`model.eval()`"),
    Pitfall.EXPLICIT_IN_PRODUCTION: Entry(
        "hand-written attention in production", "explicit attention in production", _S + "10",
        "`T²` memory saved for backward", "none: measure", "fused `F.scaled_dot_product_attention`",
        "生产环境中使用手写注意力", "反向传播保存 `T²` 大小的显存", "使用融合的 `F.scaled_dot_product_attention`"),
    Pitfall.KV_CACHE: Entry(
        "KV-cache misconceptions", "KV-cache misconceptions", _S + "11",
        "cache memory grows with `B · T`; steps still read all of it", "none: measure", "budget it, measure the speed-up",
        "对 KV 缓存的误解", "缓存显存随 `B · T` 增长；每步解码仍要读完整个缓存", "为缓存做预算，实测加速比"),
    Pitfall.COLD_TIMING: Entry(
        "first-run CPU timing", "first-run timing", _S + "12",
        "first call ≫ warm calls", "none: measure", "warm up, synchronise, median, conditions",
        "把首次运行的耗时当作性能", "首次调用远慢于预热后的调用", "预热、同步、取中位数、写明条件"),
    Pitfall.UNSHIFTED_TARGETS: Entry(
        "LM targets not shifted", "targets not shifted", _S + "13",
        "loss near zero, model only copies", "`diagnose_lm_loss`", "`logits[:, :-1]` vs `ids[:, 1:]`",
        "语言模型的目标没有移位", "损失接近零，模型只会复制输入", "`logits[:, :-1]` 对应 `ids[:, 1:]`"),
    Pitfall.PADDING_IN_LOSS: Entry(
        "padding counted in the loss", "padding in the loss", _S + "14",
        "loss changes when padding is added", "`diagnose_lm_loss`", "`ignore_index=pad_id`, divide by real tokens",
        "损失中计入了填充", "添加填充后损失发生变化", "`ignore_index=pad_id`，只除以真实 token 数"),
    Pitfall.ACC_NOT_RESCALED: Entry(
        "accumulator not rescaled when the running maximum grows", "`acc` (or `l`) not rescaled by `exp(m - m_new)`",
        _T + "2. The online softmax",
        "right while the first tile holds each row's maximum, wrong once a later tile raises it", "`diagnose_online_softmax`, "
        "`diagnose_tiled_attention`", "`alpha = exp(m - m_new)`; `l = alpha * l + p.sum(-1)`, `acc = alpha * acc + p @ v`",
        "运行最大值变大时没有重新缩放累加器", "每行最大值都在第一块时结果正确，后面的块抬高最大值后就出错",
        "`alpha = exp(m - m_new)`；`l = alpha * l + p.sum(-1)`，`acc = alpha * acc + p @ v`"),
    Pitfall.NO_FINAL_DIVISION: Entry(
        "the division by l forgotten, or done per tile", "`acc / l` missing or inside the tile loop", _T + "2. The online softmax",
        "with v = ones the rows are not ones; right with one key tile only when done per tile",
        "`diagnose_tiled_attention`", "divide `acc / l` once, after the last key tile",
        "忘了除以 l，或者每个块都除一次", "v 全为 1 时输出不是全 1；若每块都除，只有一个键块时才正确",
        "在最后一个键块之后只做一次 `acc / l`"),
    Pitfall.MASKED_TILE_NAN: Entry(
        "NaN from a tile whose every entry is masked (-inf - -inf)", "`exp(-inf - -inf)` in a fully masked tile or row",
        _T + "3. Tiles of q against tiles of k and v",
        "NaN rows when a row's first key tile is all masked, or the row may see nothing", "`diagnose_online_softmax`, "
        "`diagnose_tiled_attention`", "subtract `m_new.masked_fill(m_new == -inf, 0)`; divide by `l` only where `l > 0`",
        "整块都被掩码时产生 NaN（-inf 减 -inf）", "某行的第一个键块全被掩码，或整行什么都不能看时，输出出现 NaN",
        "减去 `m_new.masked_fill(m_new == -inf, 0)`；只在 `l > 0` 处除以 `l`"),
    Pitfall.DIAGONAL_TILE_SKIPPED: Entry(
        "the diagonal tile skipped under a causal mask", "causal skipping drops the diagonal tile", _T + "4. A causal mask",
        "a query never reads its own key (row 0 empty: zeros or NaN)", "`diagnose_causal_tiles`",
        "skip only key blocks starting at or after `Tk - Tq + q1`; mask inside the diagonal tile",
        "因果掩码下跳过了对角线上的块", "查询读不到自己的键（第 0 行为空：全零或 NaN）",
        "只跳过起点不小于 `Tk - Tq + q1` 的键块；对角线块内部用掩码"),
    Pitfall.KV_GROUPING: Entry(
        "query heads mapped to the wrong K/V heads: repeat vs repeat_interleave",
        "`repeat` (k0 k1 k0 k1) where `repeat_interleave` (k0 k0 k1 k1) is meant, or the reverse",
        _K + "2. Fewer K/V heads: multi-query and grouped-query",
        "shapes fine, outputs differ; right only when kv_heads is 1 or heads", "`diagnose_kv_grouping`, `diagnose_expand_kv`",
        "query head `h` reads K/V head `h // (heads // kv_heads)`: `kv.repeat_interleave(heads // kv_heads, dim=1)`",
        "查询头对应到了错误的 K/V 头：混淆了 repeat 与 repeat_interleave",
        "形状都对，输出却不同；只有 kv_heads 为 1 或等于 heads 时才正确",
        "查询头 `h` 读取 K/V 头 `h // (heads // kv_heads)`：`kv.repeat_interleave(heads // kv_heads, dim=1)`"),
    Pitfall.WINDOW_OFF_BY_ONE: Entry(
        "sliding window off by one: window + 1 or window - 1 keys per query", "window lets a query see `window ± 1` keys",
        _K + "6. The sliding window and its rolling buffer",
        "a query sees one key too many or too few; the window counts the query itself", "`diagnose_window`",
        "the query at position `p` sees keys `p - window + 1 … p`: `causal_mask(t_q, t_k, window=window)`",
        "滑动窗口差一位：每个查询看到 window + 1 或 window - 1 个键", "查询多看或少看了一个键；窗口把查询自己也算在内",
        "位置 `p` 上的查询看到键 `p - window + 1 … p`：`causal_mask(t_q, t_k, window=window)`"),
    Pitfall.FORGOTTEN_ALL_REDUCE: Entry(
        "the forgotten all-reduce: each rank holds a partial sum", "row-parallel output used without its all-reduce",
        _P + "6. What breaks",
        "the ranks' outputs differ from each other and from one process; their sum is right", "`diagnose_row_parallel`",
        "all-reduce the row-parallel partial sums (`reduce_from_parallel`), then add the bias",
        "忘了全归约：每个 rank 只持有部分和", "各 rank 的输出互不相同，也不同于单进程的结果；它们的和才是对的",
        "对行并行的部分和做全归约（`reduce_from_parallel`），再加偏置"),
    Pitfall.QKV_SPLIT_ONE_PIECE: Entry(
        "the fused QKV weight split in one piece", "`qkv.weight.chunk(P)[r]` instead of per Q/K/V and per head",
        _P + "2. Tensor-parallel attention",
        "right shapes, wrong heads: a rank gets Q rows of some heads and K rows of others", "`diagnose_qkv_split`",
        "take rank r's heads from each of W_q, W_k and W_v: `shard_qkv(weight, r, P, heads, kv_heads)`",
        "把融合的 QKV 权重一刀切开", "形状都对，头却错了：一个 rank 拿到一些头的 Q 行和另一些头的 K 行",
        "分别从 W_q、W_k、W_v 中取 rank r 的头：`shard_qkv(weight, r, P, heads, kv_heads)`"),
    Pitfall.BIAS_BEFORE_ALL_REDUCE: Entry(
        "the output-projection bias added on every rank before the all-reduce", "row-parallel bias added before the sum",
        _P + "6. What breaks",
        "the output is off by exactly (P - 1) · bias on every rank", "`diagnose_row_parallel`",
        "add the row-parallel bias once, after the all-reduce",
        "在全归约之前就在每个 rank 上加了输出投影的偏置", "每个 rank 的输出都恰好多了 (P - 1) · bias",
        "在全归约之后只加一次行并行的偏置"),
    Pitfall.RING_LOCAL_OFFSET: Entry(
        "ring attention without the global causal offset", "each arriving K/V block masked as if it started at 0",
        _P + "4. Ring attention",
        "rank 0 sees the future, later ranks lose half of their past", "`diagnose_ring_attention`",
        "mask with global positions: key j is seen by query i iff position(j) <= position(i)",
        "环形注意力没有用全局因果偏移", "rank 0 看到了未来，后面的 rank 丢掉了一半的过去",
        "用全局位置做掩码：当且仅当 position(j) <= position(i) 时查询 i 能看到键 j"),
    Pitfall.DROPOUT_RNG_UNSYNCED: Entry(
        "dropout with unsynchronised RNG across tensor-parallel ranks", "residual dropout seeded differently per rank",
        _P + "6. What breaks",
        "activations that every rank should hold identically drift apart", "`diagnose_replicated`",
        "seed the RNG identically on the tensor-parallel ranks for dropout on replicated tensors",
        "张量并行的各 rank 之间 dropout 的随机数生成器不同步", "本应在每个 rank 上完全相同的激活彼此偏离",
        "对复制张量上的 dropout，在张量并行的各 rank 上使用相同的随机种子"),
}

# number -> title, for code that still holds a plain int (e.g. findings read back from JSON)
PITFALLS: dict[int, str] = {int(p): e.title for p, e in CATALOG.items()}


def glance_table(lang: str | None = None, *, chapter: str = "08") -> str:
    """The "at a glance" table of the pitfalls that chapter ``chapter`` teaches, as markdown: chapter 08's
    fourteen by default, ``chapter="10"`` for tiled attention's, ``chapter="11"`` for smaller KV caches',
    ``chapter="12"`` for attention across processes'.
    In English or Chinese (``"zh"``); by default in the running notebook's language
    (:func:`tinytf.language.notebook_language`)."""
    if lang is None:
        lang = notebook_language()
    chosen = [(p, e) for p, e in CATALOG.items() if p and e.section.startswith(f"{chapter}_")]
    if lang == "zh":
        head = "| # | 陷阱 | 症状 | 检测 | 修复 |\n|---|---|---|---|---|"
        rows = [f"| {int(p)} | {e.title_zh} | {e.symptom_zh} | {e.detector} | {e.fix_zh} |" for p, e in chosen]
    else:
        head = "| # | pitfall | symptom | detector | fix |\n|---|---|---|---|---|"
        rows = [f"| {int(p)} | {e.short} | {e.symptom} | {e.detector} | {e.fix} |" for p, e in chosen]
    return "\n".join([head, *rows])
