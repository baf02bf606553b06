"""An IO model: bytes moved between slow memory (HBM, DRAM) and a fast memory of ``M`` bytes (SRAM,
cache) by one head's attention forward, counted from each algorithm's loop structure.

* explicit (the FlashAttention paper's "standard attention"): ``S = QKᵀ`` is written out, read back
  for the softmax, ``P`` written, read back for ``PV`` — Θ(Nd + N²) accesses whatever ``M`` is;
* tiled (FlashAttention-2's loop order, :func:`tinytf.tiled_attention`): each query block is read once
  and every key/value block it needs streams past it, so K and V are read once *per query block*.
  The larger the query block that fits in ``M``, the fewer passes: about ``N·d/M`` passes of ``2Nd``
  elements, Θ(N²d²/M).
"""

from __future__ import annotations

import math

__all__ = ["attention_io_bytes", "tiled_io_blocks", "IO_METHODS"]

IO_METHODS = ("explicit", "tiled")


def _footprint(block_q: int, block_k: int, head_dim: int) -> int:
    """Elements the tiled loop keeps in fast memory: Q_i, acc ``[bq, d]``, m, l ``[bq]``,
    K_j, V_j ``[bk, d]`` and the score tile ``[bq, bk]``."""
    return 2 * block_q * head_dim + 2 * block_q + 2 * block_k * head_dim + block_q * block_k


def tiled_io_blocks(tokens: int, head_dim: int, fast_memory: int, bytes_per: int = 4) -> tuple[int, int]:
    """``(block_q, block_k)`` for the tiled loop in ``fast_memory`` bytes.

    The block that streams past is at most ``d`` rows (``block_k = min(d, N)``); the query block — the
    one that is *reused* against every key block in this loop order — is the largest that fits (at most
    ``N``). FlashAttention-1's Algorithm 1 has the opposite loop order (key/value blocks outside) and so
    the roles swapped: its key/value blocks are the large ones, ``B_c = ⌈M/4d⌉`` rows, and it bounds the
    *query* block, ``B_r = min(⌈M/4d⌉, d)``. Either way the streamed block is the one bounded by ``d``.
    Raises ``ValueError`` when not even one query row fits.
    """
    if tokens < 1 or head_dim < 1 or bytes_per < 1:
        raise ValueError(f"tokens, head_dim and bytes_per must be positive, got {tokens}, {head_dim}, {bytes_per}")
    capacity = fast_memory // bytes_per  # elements that fit
    block_k = min(head_dim, tokens)
    block_q = (capacity - 2 * block_k * head_dim) // (2 * head_dim + 2 + block_k)
    if block_q < 1:
        need = _footprint(1, block_k, head_dim) * bytes_per
        raise ValueError(
            f"fast memory of {fast_memory} bytes cannot hold one tile for head_dim={head_dim}: one query row, "
            f"a [{block_k}, {head_dim}] key and value block and their scores need {need} bytes. Pass fast_memory >= {need}."
        )
    return min(block_q, tokens), block_k


def attention_io_bytes(
    tokens: int,
    head_dim: int,
    fast_memory: int,
    *,
    method: str = "explicit",
    bytes_per: int = 4,
    causal: bool = False,
    block_q: int | None = None,
    block_k: int | None = None,
) -> int:
    """Bytes one head's attention forward reads from and writes to slow memory (N = ``tokens``, d = ``head_dim``).

    ``method="explicit"``: read Q, K, write S (``2Nd + N²``); with ``causal`` read S, write the masked S
    (``2N²``); read S, write P (``2N²``); read P, V, write O (``N² + 2Nd``).
    ``method="tiled"``: for each query block read Q_i once, read every K_j, V_j it needs (all of
    them, or under ``causal`` those up to its diagonal), write O_i and lse_i once. Block sizes come
    from :func:`tiled_io_blocks` unless given.
    """
    if method not in IO_METHODS:
        raise ValueError(f"method must be one of {IO_METHODS}, got {method!r}")
    n, d = tokens, head_dim
    if method == "explicit":
        elements = (2 * n * d + n * n) + (2 * n * n if causal else 0) + 2 * n * n + (n * n + 2 * n * d)
        return elements * bytes_per
    bq, bk = tiled_io_blocks(n, d, fast_memory, bytes_per) if block_q is None or block_k is None else (block_q, block_k)
    elements = 0
    for q0 in range(0, n, bq):
        q1 = min(q0 + bq, n)
        keys = min(n, math.ceil(q1 / bk) * bk) if causal else n  # rows of the key blocks this query block reads
        elements += (q1 - q0) * d  # Q_i, read once
        elements += 2 * keys * d  # K_j and V_j, streamed past Q_i
        elements += (q1 - q0) * d + (q1 - q0)  # O_i and lse_i, written once
    return elements * bytes_per
