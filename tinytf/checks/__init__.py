"""Diagnostics that name the mistake: property checks for attention, causal masks, blocks and the LM loss.

The usual bugs in attention code are silent — the shapes are right and the numbers are wrong. Each
``diagnose_*`` function here treats your code as a black box, feeds it several random inputs and shapes
(``Tq != Tk``, ``d_head != D``, ``B > 1``, several seeds), compares the answers with references and
with *deliberately wrong* references, and returns a list of :class:`Finding` (empty when nothing is
wrong). A finding is named from the probes on which your code is wrong, so a mistake that shows on
some inputs only (only when ``Tq == Tk``, only with a mask, only for left padding) is named too, and
the message says which inputs show it.

``Finding.pitfall`` is a :class:`Pitfall` from the catalog (:mod:`tinytf.checks.catalog`), the one
place that names, teaches and fixes each mistake; ``int(pitfall)`` is its number: 1-14 in chapter 08,
15-18 in chapter 10, 19-20 in chapter 11, 21-29 in chapter 12, 30-36 in chapter 13, 40-44 in chapter 14
(``Pitfall.GENERAL`` = 0: the code raised, returned the wrong type, changed its inputs, ...). ``glance_table()`` is
chapter 08's table of its fourteen (``chapter="10"``: tiled attention's, ``chapter="11"``: grouped-query attention's
and the sliding window's, ``chapter="14"``: half precision's); ``catalog_markdown()`` is every chapter's table, one
heading each.

Usage::

    from tinytf.checks import diagnose_attention, report
    print(report(diagnose_attention(my_attention)))

Every detector catches exceptions from the code under test and turns them into a finding, so a
half-written function (``raise NotImplementedError``) is diagnosed, not crashed on.

Layout: ``catalog`` (the pitfalls), ``findings`` (Finding, report), ``probe`` (shared probe helpers),
``attention`` + ``attention_refs``, ``masks`` (causal masks), ``block``, ``loss``, ``tiled`` (online softmax,
tiled and causal-tiled attention), ``grouped`` (K/V head sharing), ``window`` (sliding-window masks),
``parallel`` (attention split across processes), ``context`` (Ulysses, the overlapped ring, sequence
parallelism's replicated gradients, grouped-query K/V on the ring), ``precision`` (half precision, masks, loss
scaling, compiled timings), ``rope`` (the rotation, a cached RoPE
step) and ``positions`` (ALiBi's bias, a left-padded batch's positions).
"""

from __future__ import annotations

from .attention import diagnose_attention
from .block import diagnose_block
from .catalog import CATALOG, PITFALLS, Entry, Pitfall, catalog_markdown, chapters_with_pitfalls, glance_table
from .context import diagnose_overlapped_ring, diagnose_replicated_grads, diagnose_ring_traffic, diagnose_ulysses
from .findings import Finding, found, report
from .grouped import diagnose_expand_kv, diagnose_kv_grouping
from .loss import diagnose_lm_loss
from .masks import diagnose_causal_mask
from .parallel import diagnose_qkv_split, diagnose_replicated, diagnose_ring_attention, diagnose_row_parallel
from .positions import diagnose_alibi, diagnose_padded_positions
from .precision import diagnose_grad_underflow, diagnose_half_attention, diagnose_masked_rows, diagnose_timings
from .rope import diagnose_rope, diagnose_rope_decode
from .tiled import diagnose_online_softmax, diagnose_tiled_attention
from .tiled_causal import diagnose_causal_tiles
from .window import diagnose_window

__all__ = [
    "Finding",
    "PITFALLS",
    "Pitfall",
    "CATALOG",
    "Entry",
    "glance_table",
    "catalog_markdown",
    "chapters_with_pitfalls",
    "found",
    "report",
    "diagnose_attention",
    "diagnose_causal_mask",
    "diagnose_block",
    "diagnose_lm_loss",
    "diagnose_online_softmax",
    "diagnose_tiled_attention",
    "diagnose_causal_tiles",
    "diagnose_kv_grouping",
    "diagnose_expand_kv",
    "diagnose_window",
    "diagnose_qkv_split",
    "diagnose_row_parallel",
    "diagnose_replicated",
    "diagnose_ring_attention",
    "diagnose_half_attention",
    "diagnose_masked_rows",
    "diagnose_grad_underflow",
    "diagnose_timings",
    "diagnose_ulysses",
    "diagnose_overlapped_ring",
    "diagnose_replicated_grads",
    "diagnose_ring_traffic",
    "diagnose_rope",
    "diagnose_rope_decode",
    "diagnose_alibi",
    "diagnose_padded_positions",
]
