"""tinytf.checks' tiled-attention diagnoses: silent on correct code, and each chapter-10 pitfall named on
code written the way students write it (one wrong implementation per mistake)."""

from __future__ import annotations

import math

import pytest
import torch
from _diagnoses import pitfalls

import tinytf
from tinytf import online_softmax_update
from tinytf.checks import Pitfall, diagnose_causal_tiles, diagnose_online_softmax, diagnose_tiled_attention, glance_table, report

NEG_INF = float("-inf")


# ---- the online softmax update, right and wrong -------------------------------------------------

def update_right(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    m_safe = torch.where(m_new == NEG_INF, torch.zeros_like(m_new), m_new)
    p = torch.exp(scores - m_safe)
    alpha = torch.exp(m - m_safe)
    return m_new, alpha * l + p.sum(dim=-1, keepdim=True), alpha * acc + p @ v


def update_acc_not_rescaled(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    m_safe = torch.where(m_new == NEG_INF, torch.zeros_like(m_new), m_new)
    p = torch.exp(scores - m_safe)
    l_new = torch.exp(m - m_safe) * l + p.sum(dim=-1, keepdim=True)
    return m_new, l_new, acc + p @ v  # forgot: the old acc was summed against the old maximum


def update_nothing_rescaled(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    m_safe = torch.where(m_new == NEG_INF, torch.zeros_like(m_new), m_new)
    p = torch.exp(scores - m_safe)
    return m_new, l + p.sum(dim=-1, keepdim=True), acc + p @ v


def update_nan(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    p = torch.exp(scores - m_new)  # -inf - -inf = NaN when the whole tile is masked
    alpha = torch.exp(m - m_new)
    return m_new, alpha * l + p.sum(dim=-1, keepdim=True), alpha * acc + p @ v


# ---- tiled forwards ------------------------------------------------------------------------------

def make_tiled(update=online_softmax_update, finish="once"):
    """A student's tiled forward around ``update``; ``finish``: "once" (right), "never" (no division),
    "unguarded" (acc / l even where l = 0)."""

    def tiled(q, k, v, mask=None, *, block_q, block_k):
        t_q, t_k = q.size(-2), k.size(-2)
        out = torch.zeros(*q.shape[:-1], v.size(-1))
        for q0 in range(0, t_q, block_q):
            q1 = min(q0 + block_q, t_q)
            q_i = q[..., q0:q1, :] / math.sqrt(q.size(-1))
            m = torch.full((*q.shape[:-2], q1 - q0, 1), NEG_INF)
            l, acc = torch.zeros_like(m), torch.zeros(*q.shape[:-2], q1 - q0, v.size(-1))
            for k0 in range(0, t_k, block_k):
                k1 = min(k0 + block_k, t_k)
                s = q_i @ k[..., k0:k1, :].transpose(-2, -1)
                if mask is not None:
                    s = s.masked_fill(~mask_tile(mask, q0, q1, k0, k1), NEG_INF)
                m, l, acc = update(m, l, acc, s, v[..., k0:k1, :])
            if finish == "never":
                out[..., q0:q1, :] = acc
            elif finish == "unguarded":
                out[..., q0:q1, :] = acc / l
            else:
                out[..., q0:q1, :] = acc / torch.where(l == 0, torch.ones_like(l), l)
        return out

    return tiled


def mask_tile(mask, q0, q1, k0, k1):
    rows = slice(q0, q1) if mask.size(-2) > 1 else slice(None)
    cols = slice(k0, k1) if mask.size(-1) > 1 else slice(None)
    return mask[..., rows, cols]


def tiled_softmax_per_tile(q, k, v, mask=None, *, block_q, block_k):
    """Each key tile gets its own softmax, and the tiles' outputs are added: the division per tile."""
    out = torch.zeros(*q.shape[:-1], v.size(-1))
    for k0 in range(0, k.size(-2), block_k):
        s = q @ k[..., k0:k0 + block_k, :].transpose(-2, -1) / math.sqrt(q.size(-1))
        out = out + torch.softmax(s, dim=-1) @ v[..., k0:k0 + block_k, :]
    return out


def tiled_full_matrix(q, k, v, mask=None, *, block_q, block_k):
    """Right numbers, but the whole [B, H, Tq, Tk] score matrix at once."""
    return tinytf.scaled_dot_product_attention(q, k, v, mask)


# ---- causal tile skipping ------------------------------------------------------------------------

def make_causal(end="right", strict=False):
    """A student's causal tiled attention: ``end`` "right" (stop at Tk - Tq + q1), "diagonal" (stop at the
    query block's first position: the diagonal tile is skipped) or "all" (no skipping)."""

    def causal(q, k, v, *, block_q, block_k):
        t_q, t_k = q.size(-2), k.size(-2)
        offset, out, computed = t_k - t_q, torch.zeros(*q.shape[:-1], v.size(-1)), 0
        for q0 in range(0, t_q, block_q):
            q1 = min(q0 + block_q, t_q)
            stop = {"right": offset + q1, "diagonal": offset + q0, "all": t_k}[end]
            q_i = q[..., q0:q1, :] / math.sqrt(q.size(-1))
            m = torch.full((*q.shape[:-2], q1 - q0, 1), NEG_INF)
            l, acc = torch.zeros_like(m), torch.zeros(*q.shape[:-2], q1 - q0, v.size(-1))
            for k0 in range(0, min(stop, t_k), block_k):
                k1 = min(k0 + block_k, t_k)
                s = q_i @ k[..., k0:k1, :].transpose(-2, -1)
                q_pos = torch.arange(q0, q1)[:, None] + offset
                k_pos = torch.arange(k0, k1)[None, :]
                allowed = k_pos < q_pos if strict else k_pos <= q_pos
                m, l, acc = online_softmax_update(m, l, acc, s.masked_fill(~allowed, NEG_INF), v[..., k0:k1, :])
                computed += 1
            out[..., q0:q1, :] = acc / torch.where(l == 0, torch.ones_like(l), l)
        return out, computed

    return causal


def test_correct_code_gets_no_finding():
    assert diagnose_online_softmax(update_right) == []
    assert diagnose_online_softmax(online_softmax_update) == []
    assert diagnose_tiled_attention(make_tiled(update_right)) == []
    assert diagnose_tiled_attention(lambda *a, **kw: tinytf.tiled_attention(*a, **kw)) == []
    assert diagnose_causal_tiles(make_causal()) == []
    assert diagnose_causal_tiles(lambda q, k, v, **kw: (lambda o, s: (o, s.computed))(
        *tinytf.tiled_attention(q, k, v, is_causal=True, return_stats=True, **kw))) == []


@pytest.mark.parametrize("fn, pitfall, words", [
    (update_acc_not_rescaled, Pitfall.ACC_NOT_RESCALED, "acc (l is right)"),
    (update_nothing_rescaled, Pitfall.ACC_NOT_RESCALED, "l and acc"),
    (update_nan, Pitfall.MASKED_TILE_NAN, "exp(-inf - -inf)"),
], ids=["acc_not_rescaled", "nothing_rescaled", "nan"])
def test_update_mistakes_are_named(fn, pitfall, words):
    findings = diagnose_online_softmax(fn)
    assert pitfalls(findings) == {pitfall}, report(findings)
    assert words in report(findings) and pitfall.fix.replace("`", "") in report(findings)


@pytest.mark.parametrize("fn, pitfall, words", [
    (make_tiled(update_acc_not_rescaled), Pitfall.ACC_NOT_RESCALED, "not rescaled"),
    (make_tiled(finish="never"), Pitfall.NO_FINAL_DIVISION, "not divided by l"),
    (tiled_softmax_per_tile, Pitfall.NO_FINAL_DIVISION, "per tile"),
    (make_tiled(update_nan), Pitfall.MASKED_TILE_NAN, "first key tile is entirely masked"),
    (make_tiled(finish="unguarded"), Pitfall.MASKED_TILE_NAN, "0 / 0"),
    (tiled_full_matrix, Pitfall.EXPLICIT_IN_PRODUCTION, "whole score matrix"),
], ids=["acc_not_rescaled", "no_division", "softmax_per_tile", "nan_update", "nan_finish", "full_matrix"])
def test_tiled_mistakes_are_named(fn, pitfall, words):
    findings = diagnose_tiled_attention(fn)
    assert pitfalls(findings) == {pitfall}, report(findings)
    assert words in report(findings), report(findings)


@pytest.mark.parametrize("fn, pitfall, words", [
    (make_causal(end="diagonal"), Pitfall.DIAGONAL_TILE_SKIPPED, "diagonal tile is skipped"),
    (make_causal(strict=True), Pitfall.CAUSAL_OFF_BY_ONE, "its own key"),
    (make_causal(end="all"), Pitfall.GENERAL, "no tile is skipped"),
], ids=["diagonal_skipped", "strict_mask", "no_skipping"])
def test_causal_mistakes_are_named(fn, pitfall, words):
    findings = diagnose_causal_tiles(fn)
    assert pitfalls(findings) == {pitfall}, report(findings)
    assert words in report(findings), report(findings)


def test_a_crash_on_a_partial_last_tile_says_so():
    def multiples_only(q, k, v, mask=None, *, block_q, block_k):
        assert k.size(-2) % block_k == 0, "T must be a multiple of block_k"
        return make_tiled()(q, k, v, mask, block_q=block_q, block_k=block_k)

    findings = diagnose_tiled_attention(multiples_only)
    assert pitfalls(findings) == {Pitfall.GENERAL} and "not a multiple of the block" in report(findings), report(findings)


def test_the_glance_table_stays_chapter_08s_fourteen_and_chapter_10_has_its_own():
    rows = glance_table("en").splitlines()[2:]
    assert [int(r.split("|")[1]) for r in rows] == list(range(1, 15))
    tiled = [int(r.split("|")[1]) for r in glance_table("zh", chapter="10").splitlines()[2:]]
    assert tiled == [int(p) for p in (Pitfall.ACC_NOT_RESCALED, Pitfall.NO_FINAL_DIVISION, Pitfall.MASKED_TILE_NAN,
                                      Pitfall.DIAGONAL_TILE_SKIPPED)]
