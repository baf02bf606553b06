"""Exercise 11's mutants: the QKV split, the row-parallel projection, ring attention's merge, Ulysses' all-to-all
(see :mod:`.`).

Part D's student function is Ulysses' first all-to-all only (the job runs attention on what it returns, and no inverse
all-to-all follows): "the inverse all-to-all missing" has no place in it; the inverse all-to-all written in its place
(the sequence split and the heads joined) is one of its mistakes."""

from __future__ import annotations

from typing import Any

from tinytf.checks import Pitfall

from ....translation import N_
from . import Correct, Family, Mutant

_CAT = ("return torch.cat([w_q[rank * q_rows:(rank + 1) * q_rows],\n"
        "                      w_k[rank * kv_rows:(rank + 1) * kv_rows],\n"
        "                      w_v[rank * kv_rows:(rank + 1) * kv_rows]])")
_PARTS = "w_q, w_k, w_v = weight.split([heads * d, kv_heads * d, kv_heads * d])"
PER_HEAD = N_("take rank r's heads from each of W_q, W_k and W_v: shard_qkv(weight, r, P, heads, kv_heads)")


def _rows(value: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Which rows rank 1 of P = 2 holds, and which it should hold, in words."""
    from tinytf.checks.findings import slice_map
    from tinytf.checks.parallel import qkv_rows
    from tinytf.parallel import shard_qkv

    w, heads, kv = inputs["weight"], int(inputs["heads"]), int(inputs["kv_heads"])
    d = w.size(0) // (heads + 2 * kv)
    got, want = value["P2"][1], shard_qkv(w, 1, 2, heads, kv)
    return {"heads": heads, "kv": kv, "got": qkv_rows(slice_map(got, w, 0), heads, kv, d) or list(got.shape),
            "want": qkv_rows(slice_map(want, w, 0), heads, kv, d)}


SPLIT = Family(
    task="ex11_split", cell="ex11_split_code", subject="split_qkv",
    source=("def split_qkv(weight: torch.Tensor, rank: int, world: int, heads: int, kv_heads: int) -> torch.Tensor:\n"
            "    d = weight.size(0) // (heads + 2 * kv_heads)\n"
            f"    {_PARTS}\n"
            "    q_rows, kv_rows = heads // world * d, kv_heads // world * d\n"
            f"    {_CAT}\n"),
    mutants=(
        Mutant("one_piece", Pitfall.QKV_SPLIT_ONE_PIECE, N_("the fused QKV weight was cut in one piece"),
               N_("your rank 1 of P = 2 holds {got} (weight.chunk(P)[rank]); with heads = {heads}, kv_heads = {kv} it should hold "
                  "{want}."), PER_HEAD, facts=_rows, edits=((_CAT, "return weight.chunk(world)[rank]"),)),
        Mutant("equal_thirds", Pitfall.QKV_SPLIT_ONE_PIECE, N_("split_qkv cuts [W_q; W_k; W_v] into equal thirds"),
               N_("your parts are weight.chunk(3): with heads = {heads} and kv_heads = {kv} the three parts differ in size, so rank 1 "
                  "of P = 2 holds {got} instead of {want}."),
               N_("cut the parts by their sizes: weight.split([heads * d, kv_heads * d, kv_heads * d])"), facts=_rows,
               edits=((_PARTS, "w_q, w_k, w_v = weight.chunk(3)"),)),
        Mutant("round_robin", Pitfall.QKV_SPLIT_ONE_PIECE, N_("split_qkv deals the heads round-robin"),
               N_("your rank r takes heads r, r + P, r + 2P, …: rank 1 of P = 2 holds {got}; each rank's heads are one contiguous "
                  "block, {want}."),
               N_("give rank r the contiguous heads r · heads / P … (r + 1) · heads / P - 1 of each part"), facts=_rows,
               edits=((_CAT, "def heads_of(w, n):\n"
                             "        return w.reshape(n, d, *w.shape[1:])[rank::world].reshape(-1, *w.shape[1:])\n"
                             "    return torch.cat([heads_of(w_q, heads), heads_of(w_k, kv_heads), heads_of(w_v, kv_heads)])"),)),
        Mutant("kv_cut_by_query_heads", Pitfall.KV_GROUPING, N_("split_qkv cuts W_k and W_v by the query heads' count"),
               N_("your W_k and W_v slices are heads / P heads long, like W_q's; with kv_heads = {kv} < heads = {heads} they are "
                  "kv_heads / P heads long: rank 1 of P = 2 holds {got}, should hold {want}."),
               N_("cut W_k and W_v into kv_heads / P heads per rank: kv_rows = kv_heads // world * d"), facts=_rows,
               edits=(("q_rows, kv_rows = heads // world * d, kv_heads // world * d", "q_rows = kv_rows = heads // world * d"),)),
        Mutant("kv_whole", Pitfall.GENERAL, N_("split_qkv gives every rank all of W_k and W_v"),
               N_("your ranks each hold their W_q rows and every W_k and W_v row: rank 1 of P = 2 holds {got}, should hold {want}."),
               PER_HEAD, facts=_rows,
               edits=(("w_k[rank * kv_rows:(rank + 1) * kv_rows]", "w_k"), ("w_v[rank * kv_rows:(rank + 1) * kv_rows]", "w_v"))),
    ),
    correct=(Correct("index_lists", edits=((_CAT, "hq, hk = heads // world, kv_heads // world\n"
                                                  "    rows = [h * d + i for h in range(rank * hq, (rank + 1) * hq) for i in range(d)]\n"
                                                  "    rows += [heads * d + h * d + i for h in range(rank * hk, (rank + 1) * hk) "
                                                  "for i in range(d)]\n"
                                                  "    rows += [(heads + kv_heads) * d + h * d + i "
                                                  "for h in range(rank * hk, (rank + 1) * hk) "
                                                  "for i in range(d)]\n"
                                                  "    return weight[rows]"),)),
             Correct("chunk_parts", edits=((_CAT, "return torch.cat([w_q.chunk(world)[rank], w_k.chunk(world)[rank], "
                                                  "w_v.chunk(world)[rank]])"),))),
)

_ROW = "return comm.all_reduce(partial) + bias"

ROW = Family(
    task="ex11_row", cell="ex11_row_code", subject="row_parallel",
    source=("def row_parallel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, comm: \"tinytf.collectives.Comm\") "
            "-> torch.Tensor:\n"
            "    partial = x @ weight.T\n"
            f"    {_ROW}\n"),
    mutants=(
        Mutant("forgotten_all_reduce", Pitfall.FORGOTTEN_ALL_REDUCE, N_("each rank holds a partial sum"),
               N_("your ranks' outputs differ, and their sum (less the extra biases) is the single-process output: x @ weight.T is "
                  "returned without the all-reduce."),
               N_("all-reduce the row-parallel partial sums (reduce_from_parallel), then add the bias"),
               edits=((_ROW, "return partial + bias"),)),
        Mutant("bias_every_rank", Pitfall.BIAS_BEFORE_ALL_REDUCE, N_("the bias is added on every rank before the all-reduce"),
               N_("every rank's output is the reference plus (P - 1) biases: the bias is added 2 times with P = 2 ranks, 4 times "
                  "with P = 4, because the all-reduce sums each rank's partial + bias."),
               N_("add the row-parallel bias once, after the all-reduce"), edits=((_ROW, "return comm.all_reduce(partial + bias)"),)),
        Mutant("averaged", Pitfall.GENERAL, N_("row_parallel averages the partial sums"),
               N_("every rank holds the same output, and without the bias it is exactly 1/P of the reference's (1/2 with P = 2, "
                  "1/4 with P = 4): the all-reduced sum was divided by P, an average where the sum belongs."),
               N_("use the all-reduced sum as it is: comm.all_reduce(partial) + bias, with no division by P"),
               edits=((_ROW, "return comm.all_reduce(partial) / comm.world + bias"),)),
        Mutant("weight_not_transposed", Pitfall.ORIENTATION, N_("row_parallel multiplies by the weight, not its transpose"),
               N_("x @ weight fails (or mixes the wrong axes): the weight is [out, in / P], so the partial product is x @ weight.T."),
               N_("multiply by the transposed weight: partial = x @ weight.T"),
               edits=(("partial = x @ weight.T", "partial = x @ weight"),)),
        Mutant("input_reduced", Pitfall.GENERAL, N_("row_parallel all-reduces the input"),
               N_("your ranks sum their input slices before the product: each rank then multiplies the sum of different features "
                  "by its own columns, which is no part of x @ weight.T."),
               N_("multiply first, then all-reduce the partial products: comm.all_reduce(x @ weight.T) + bias"),
               edits=(("partial = x @ weight.T", "partial = comm.all_reduce(x.clone()) @ weight.T"), (_ROW, "return partial + bias"))),
        Mutant("no_bias", Pitfall.GENERAL, N_("the row-parallel bias is missing"),
               N_("every rank holds the single-process output without its bias."), N_("add the bias once, after the all-reduce"),
               edits=((_ROW, "return comm.all_reduce(partial)"),)),
    ),
    correct=(Correct("bias_share", edits=((_ROW, "return comm.all_reduce(partial + bias / comm.world)"),)),
             Correct("linear", edits=(("partial = x @ weight.T", "partial = torch.nn.functional.linear(x, weight)"),))),
)

_MASK = 'scores = scores.masked_fill(pos_k > pos_q, float("-inf"))'
_QPOS = "pos_q = q_start + torch.arange(q.size(-2))[:, None]"
_KPOS = "pos_k = k_start + torch.arange(k.size(-2))[None, :]"
_RET = "return m_new, alpha * l + p.sum(-1, keepdim=True), alpha * acc + p @ v"
GLOBAL = N_("mask with global positions: key j is seen by query i iff position(j) <= position(i): masked_fill(pos_k > pos_q, -inf) "
            "with pos = start + arange")

RING = Family(
    task="ex11_ring", cell="ex11_ring_code", subject="merge_block",
    source=("def merge_block(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, "
            "q_start: int, k_start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:\n"
            "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))\n"
            f"    {_QPOS}\n"
            f"    {_KPOS}\n"
            f"    {_MASK}\n"
            "    m_new = torch.maximum(m, scores.amax(-1, keepdim=True))\n"
            "    p = torch.exp(scores - m_new)\n"
            "    alpha = torch.exp(m - m_new)\n"
            f"    {_RET}\n"),
    mutants=(
        Mutant("local_offset", Pitfall.RING_LOCAL_OFFSET, N_("the causal mask uses local positions"),
               N_("your mask counts every block's queries and keys from 0: blocks from the future are seen as if they were the "
                  "rank's own, blocks from the past are half hidden."), GLOBAL,
               edits=((_QPOS, "pos_q = torch.arange(q.size(-2))[:, None]"), (_KPOS, "pos_k = torch.arange(k.size(-2))[None, :]"))),
        Mutant("own_key_blocked", Pitfall.CAUSAL_OFF_BY_ONE, N_("the ring's causal mask is one diagonal too low"),
               N_("your mask blocks pos_k >= pos_q: query i sees keys 0 … i - 1, never its own key, and a query left with nothing "
                  "in its first block comes out NaN."),
               N_("block key j exactly when pos_k > pos_q: a query sees its own key"),
               edits=((_MASK, 'scores = scores.masked_fill(pos_k >= pos_q, float("-inf"))'),)),
        Mutant("next_key_seen", Pitfall.CAUSAL_OFF_BY_ONE, N_("the ring's causal mask is one diagonal too high"),
               N_("your mask blocks pos_k > pos_q + 1: query i also sees key i + 1, the next position."),
               N_("block key j exactly when pos_k > pos_q: no query sees a later position"),
               edits=((_MASK, 'scores = scores.masked_fill(pos_k > pos_q + 1, float("-inf"))'),)),
        Mutant("acc_not_rescaled", Pitfall.ACC_NOT_RESCALED, N_("merge_block does not rescale acc"),
               N_("your acc adds each block's p @ v without first multiplying the old acc by alpha = exp(m - m_new); l is "
                  "rescaled, so a block that raises a row's maximum leaves acc / l too large."),
               N_("acc = alpha * acc + p @ v, with alpha = exp(m - m_new)"),
               edits=((_RET, "return m_new, alpha * l + p.sum(-1, keepdim=True), acc + p @ v"),)),
        Mutant("no_mask", Pitfall.RING_LOCAL_OFFSET, N_("merge_block has no causal mask"),
               N_("your merge folds every arriving block in whole: each query also sees the keys after it, in its own block and in "
                  "every block from the future."), GLOBAL, edits=((_MASK, "pass"),)),
        Mutant("old_maximum", Pitfall.GENERAL, N_("merge_block returns the old running maximum"),
               N_("your merge returns m, not m_new: the next block rescales against a stale maximum, so the earlier blocks' sums "
                  "are scaled away (by exp(m - m_new) with the wrong m) and the result mixes incompatible exponentials."),
               N_("return the new maximum with the new sums: return m_new, l_new, acc_new"),
               edits=((_RET, _RET.replace("return m_new,", "return m,")),)),
        Mutant("unscaled", Pitfall.SCALE, N_("merge_block does not scale the scores"),
               N_("your scores are q @ kᵀ without the division by sqrt(d)."), N_("divide the scores by math.sqrt(q.size(-1))"),
               edits=(("scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))", "scores = q @ k.transpose(-2, -1)"),)),
    ),
    correct=(Correct("tinytf_update", edits=((_RET, "return tinytf.online_softmax_update(m, l, acc, scores, v)"),)),
             Correct("where_mask", edits=((_MASK, 'scores = torch.where(pos_k <= pos_q, scores, torch.tensor(float("-inf")))'),))),
)

_SEND = "chunks = x.unflatten(1, (p, x.size(1) // p)).movedim(1, 0)"
_A2A = "got = comm.all_to_all(chunks.contiguous())"
_JOIN = "return got.movedim(0, 2).flatten(2, 3)"
IN_RANK_ORDER = N_("join the received chunks along dim 2 (the sequence) in rank order: chunk i holds rank i's positions, "
                   "got.movedim(0, 2).flatten(2, 3)")


def _layout(value: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """The sizes of the probe's q (P = 2 ranks) in words: T, H, n = T / 2 positions per rank, H / 2 heads per rank."""
    b, h, t, d = inputs["q"].shape
    n = t // 2
    return {"t": t, "h": h, "n": n, "last": t - 1, "group": h // 2, "n1": n - 1, "n2": n + 1,
            "heads1": ", ".join(str(i) for i in range(1, h, 2)), "heads_right": ", ".join(str(i) for i in range(h // 2, h)),
            "shape": [b, h, n, d], "want": [b, h // 2, t, d], "inverse": [b, 2 * h, n // 2, d]}


ULYSSES = Family(
    task="ex11_ulysses", cell="ex11_ulysses_code", subject="seq_to_heads",
    source=("def seq_to_heads(x: torch.Tensor, comm: \"tinytf.collectives.Comm\") -> torch.Tensor:\n"
            "    p = comm.world\n"
            f"    {_SEND}\n"
            f"    {_A2A}\n"
            f"    {_JOIN}\n"),
    mutants=(
        Mutant("axes_swapped", Pitfall.ULYSSES_AXES_SWAPPED, N_("the received chunks were laid along the heads"),
               N_("your seq_to_heads returns {shape} on rank 1 of P = 2, not [B, H/P, T, d] = {want}: the P chunks it receives, "
                  "each rank's {n} positions of its head group, are laid side by side as heads, so every block of positions "
                  "attends only to itself."),
               N_("split dim 1 (the heads) into P chunks to send, and join the received chunks along dim 2 (the sequence) in rank "
                  "order; the output goes back the inverse way"), facts=_layout,
               edits=((_JOIN, "return got.movedim(0, 1).flatten(1, 2)"),)),
        Mutant("inverse_all_to_all", Pitfall.ULYSSES_AXES_SWAPPED, N_("seq_to_heads does the inverse all-to-all"),
               N_("your seq_to_heads splits the sequence (dim 2) to send and joins what arrives along the heads: rank 1 of P = 2 "
                  "returns {inverse}, a quarter of the positions of twice the heads — heads_to_seq's trade, not [B, H/P, T, d] = "
                  "{want}."),
               N_("split dim 1 (the heads) into P chunks to send, and join the received chunks along dim 2 (the sequence) in rank "
                  "order; the output goes back the inverse way"), facts=_layout,
               edits=((_SEND, "chunks = x.unflatten(2, (p, x.size(2) // p)).movedim(2, 0)"),
                      (_JOIN, "return got.movedim(0, 1).flatten(1, 2)"))),
        Mutant("own_chunk_first", Pitfall.GENERAL, N_("seq_to_heads joins the received chunks starting with its own"),
               N_("your rank r lays its own chunk first, then those of ranks r + 1, r + 2 …: rank 1 of P = 2 holds positions "
                  "{n} … {last}, then 0 … {n1}: the sequence rotated, so every row attends over the wrong keys."),
               IN_RANK_ORDER, facts=_layout, edits=((_JOIN, "return got.roll(-comm.rank, 0).movedim(0, 2).flatten(2, 3)"),)),
        Mutant("positions_interleaved", Pitfall.GENERAL, N_("seq_to_heads interleaves the ranks' positions"),
               N_("your result puts position i of each rank side by side: with P = 2 its sequence is 0, {n}, 1, {n2} … "
                  "(the rank axis put after the positions before flattening), not 0 … {last} in order."),
               IN_RANK_ORDER, facts=_layout, edits=((_JOIN, "return got.movedim(0, 3).flatten(2, 3)"),)),
        Mutant("no_exchange", Pitfall.GENERAL, N_("seq_to_heads never calls the all-to-all"),
               N_("your chunks never leave the rank: rank r lays the P head groups of its own {n} positions along the sequence, "
                  "so it holds no other rank's positions and its 'heads' mix every head group."),
               N_("send head group j to rank j and receive every rank's positions of yours: got = comm.all_to_all(chunks.contiguous())"),
               facts=_layout, edits=((_A2A, "got = chunks.contiguous()"),)),
        Mutant("heads_round_robin", Pitfall.GENERAL, N_("seq_to_heads deals the heads round-robin"),
               N_("your unflatten puts the rank index inner (H/P, P): rank 1 of P = 2 receives heads {heads1} (h % P = 1), not "
                  "the contiguous head group {heads_right}."),
               N_("cut the heads into P contiguous groups, the group index outer: x.unflatten(1, (P, H // P)).movedim(1, 0)"),
               facts=_layout, edits=((_SEND, "chunks = x.unflatten(1, (x.size(1) // p, p)).movedim(2, 0)"),)),
    ),
    correct=(Correct("chunk_cat", edits=((_SEND, "chunks = torch.stack(x.chunk(p, dim=1))"),
                                         (_JOIN, "return torch.cat(list(got.unbind(0)), dim=2)"))),
             Correct("reshape_permute", edits=((_SEND, "b, h, n, d = x.shape\n"
                                                       "    chunks = x.reshape(b, p, h // p, n, d).permute(1, 0, 2, 3, 4)"),
                                               (_JOIN, "return got.permute(1, 2, 0, 3, 4).reshape(b, h // p, p * n, d)")))),
)

FAMILIES = (SPLIT, ROW, RING, ULYSSES)
