"""Diagnoses for chapter 12's sequence and context splits: Ulysses, the overlapped ring, sequence parallelism,
grouped-query K/V on the ring.

* ``diagnose_ulysses(outputs, q, k, v)``: Ulysses' per-rank outputs against full attention, and against the
  attention each rank's block would compute alone (what an all-to-all with the sequence and head axes
  swapped produces).
* ``diagnose_overlapped_ring(fn)``: runs a ring-attention function on simulated ranks (threads) twice —
  every block delivered the moment it is posted, and only at ``wait()`` (the latest ``isend``/``irecv``
  allow) — and watches its buffers: a receive into a tensor still being sent, a sent tensor written before
  its wait, or an answer that depends on when the data arrives is a buffer reused before its wait.
* ``diagnose_replicated_grads(per_rank, reference)``: gradients of parameters every rank holds whole (the
  LayerNorms under sequence parallelism) that differ between ranks and sum to the right one.
* ``diagnose_ring_traffic(sent, q, kv_heads, world)``: the bytes a ring forward sent against the narrow K/V
  blocks grouped-query attention needs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import torch

from ..attention import scaled_dot_product_attention
from ..collectives import Traffic
from ..grouped import repeat_kv
from ..ring import contiguous_layout, unshard_sequence, zigzag_layout
from ..translation import gettext as _
from .catalog import Pitfall
from .findings import Finding, found
from .probe import crash_finding, quietly

__all__ = ["diagnose_ulysses", "diagnose_overlapped_ring", "diagnose_replicated_grads", "diagnose_ring_traffic", "SimulatedRing"]

Tensor = torch.Tensor


def _close(a: Any, b: Tensor, tol: float = 1e-5) -> bool:
    return isinstance(a, Tensor) and a.shape == b.shape and torch.allclose(a.float(), b.float(), rtol=tol, atol=tol)


def _attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
    groups = q.size(1) // k.size(1)
    return scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups), mask, is_causal=is_causal)


def diagnose_ulysses(outputs: Sequence[Tensor], q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool = True) -> list[Finding]:
    """``outputs[r]``: rank ``r``'s Ulysses rows (positions ``r·T/P …``) for the full ``q [B, H, T, d]``, ``k, v
    [B, kv, T, d]``. Names ``ULYSSES_AXES_SWAPPED`` when they equal each rank's block attending only to itself."""
    world, t = len(outputs), q.size(-2)
    layout = contiguous_layout(t, world)
    try:
        got = unshard_sequence(list(outputs), layout)
    except (RuntimeError, TypeError):
        got = None
    right = _attention(q, k, v, None, is_causal)
    if got is not None and _close(got, right):
        return []
    block = torch.arange(t, device=q.device) // (t // world)  # the rank that holds each position
    own = block[None, :] == block[:, None]
    if is_causal:
        own = own & torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    if got is not None and _close(got, _attention(q, k, v, own, False)):
        return [found(Pitfall.ULYSSES_AXES_SWAPPED, _("each rank's positions attended only to themselves"),
                      _("the {world} ranks' outputs equal attention within each rank's own block of {n} positions: after the "
                        "all-to-all the received chunks (one block of positions from each rank) were laid along the heads, "
                        "not the sequence, so no position ever met another rank's keys.").format(world=world, n=t // world))]
    worst = float("nan") if got is None else (got - right).abs().max().item()
    return [found(Pitfall.GENERAL, _("Ulysses attention differs from full attention"),
                  _("max |Ulysses - full attention| = {worst:.2e}, and it is not block-local attention either.").format(worst=worst),
                  fix=_("check both all-to-alls: [B, H, T/P, d] -> [B, H/P, T, d] splits dim 1 and joins dim 2 in rank order, "
                        "and the output goes back the inverse way"))]


class SimulatedRing:
    """Rank ``rank`` of ``world`` simulated ranks (threads of this process) with :class:`tinytf.collectives.Comm`'s
    ring step, ``exchange`` and ``post_exchange``. ``late=False`` delivers each block when it is posted;
    ``late=True`` only at ``wait()``, reading what the sender's buffer holds then, and fills the receive
    buffer with NaN until then (its content is undefined before the wait). ``hazards`` collects the buffer
    misuses seen."""

    def __init__(self, rank: int, world: int, board: list, barrier: threading.Barrier, *, late: bool) -> None:
        self.rank, self.world, self.late = rank, world, late
        self._board, self._barrier = board, barrier
        self._pending: list[list[Tensor]] = []  # the sends not yet waited for
        self.traffic, self.hazards = Traffic(), []

    def _swap(self, send: list[Tensor], into: list[Tensor]) -> None:
        self._board[self.rank] = [t.detach().clone() for t in send]
        self._barrier.wait()
        got = self._board[(self.rank - 1) % self.world]
        self._barrier.wait()
        with torch.no_grad():
            for r, g in zip(into, got):
                r.copy_(g)

    def exchange(self, tensors: list[Tensor], phase: str = "forward") -> list[Tensor]:
        return self.post_exchange(tensors, None, phase).wait()

    def post_exchange(self, send: list[Tensor], into: list[Tensor] | None = None, phase: str = "forward") -> Any:
        into = [torch.empty_like(t) for t in send] if into is None else into
        busy = [s for pending in self._pending for s in pending] + list(send)
        if any(r.untyped_storage().data_ptr() == s.untyped_storage().data_ptr() for r in into for s in busy):
            self.hazards.append(_("a ring step receives into a tensor that is still being sent"))
        self.traffic._moved(sum(t.nbytes for t in send), sum(t.nbytes for t in into), phase)
        versions = [t._version for t in send]
        if not self.late:
            self._swap(send, into)
            return SimpleNamespace(wait=lambda: into)
        self._pending.append(list(send))
        with torch.no_grad():
            for r in into:
                if r.is_floating_point():
                    r.fill_(float("nan"))

        def wait() -> list[Tensor]:
            if [t._version for t in send] != versions:
                self.hazards.append(_("a sent tensor was written before its wait()"))
            self._swap(send, into)
            self._pending.remove(send)
            return into

        return SimpleNamespace(wait=wait)


def _on_threads(fn: Callable, world: int, late: bool, q, k, v, layout, is_causal) -> tuple[list, list[str]]:
    board, barrier = [None] * world, threading.Barrier(world, timeout=30)
    outs: list = [None] * world
    errors: list[BaseException] = []
    comms = [SimulatedRing(r, world, board, barrier, late=late) for r in range(world)]

    def one(rank: int) -> None:
        from ..ring import shard_sequence

        try:
            with torch.no_grad():
                mine = [shard_sequence(t, layout[rank]).clone() for t in (q, k, v)]
                outs[rank] = fn(*mine, layout=layout, comm=comms[rank], is_causal=is_causal)
        except threading.BrokenBarrierError:
            pass
        except BaseException as err:  # noqa: BLE001 - reported as a finding
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(world)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    if errors:
        raise errors[0]
    return outs, sorted({h for c in comms for h in c.hazards})


@quietly
def diagnose_overlapped_ring(fn: Callable[..., Tensor], world: int = 3) -> list[Finding]:
    """Diagnose ``fn(q, k, v, *, layout, comm, is_causal) -> out`` (one rank's ring attention, blocks ``[B, H, T/P, d]``)
    on ``world`` simulated ranks, contiguous and zig-zag, causal. Names ``RING_BUFFER_REUSED`` for a buffer
    touched before its ``wait()``: a receive into a tensor being sent, a sent tensor written, or a result that
    changes with the moment the data arrives."""
    gen = torch.Generator().manual_seed(27)
    q, k, v = (torch.randn(1, 2, 4 * world, 4, generator=gen) for _ in range(3))
    right = scaled_dot_product_attention(q, k, v, is_causal=True)
    for name, layout in (("contiguous", contiguous_layout(4 * world, world)), ("zig-zag", zigzag_layout(4 * world, world))):
        layout_name = _("contiguous layout") if name == "contiguous" else _("zig-zag layout")
        where = _("on {world} simulated ranks, {layout}, q {shape}").format(world=world, layout=layout_name, shape=list(q.shape))
        runs = {}
        for late in (False, True):
            try:
                runs[late] = _on_threads(fn, world, late, q, k, v, layout, True)
            except Exception as exc:  # noqa: BLE001 - student code may raise anything
                return [crash_finding(_("the ring {where}").format(where=where), exc)]
        hazards = sorted(set(runs[False][1]) | set(runs[True][1]))
        whole = {late: unshard_sequence(outs, layout) if all(isinstance(o, Tensor) for o in outs) else None
                 for late, (outs, _hazards) in runs.items()}
        ok = {late: w is not None and _close(w, right) for late, w in whole.items()}
        nan = {late: w is not None and bool(w.isnan().any()) for late, w in whole.items()}
        if nan[True] and not nan[False]:
            hazards.append(_("a received buffer was read before its wait() (it held NaN until then)"))
        if hazards or ok[False] != ok[True]:
            evidence = _("; ").join(hazards) if hazards else _("the result is right when each block arrives at once and wrong when it "
                                                              "arrives only at wait(), or the reverse")
            return [found(Pitfall.RING_BUFFER_REUSED, _("a ring buffer is used before its wait()"),
                          _("{evidence}: on real processes the answer would depend on timing.").format(evidence=evidence),
                          where=_("Seen {where}.").format(where=where))]
        if not ok[True]:
            worst = float("nan") if whole[True] is None or whole[True].shape != right.shape else (whole[True] - right).abs().max().item()
            return [found(Pitfall.GENERAL, _("ring attention differs from full attention"),
                          _("max |ring - full causal attention| = {worst:.2e}, whenever the blocks arrive.").format(worst=worst),
                          where=_("Seen {where}.").format(where=where),
                          fix=_("check the online-softmax merge and the global positions of each arriving block"))]
    return []


def diagnose_replicated_grads(per_rank: Sequence[Mapping[str, Tensor]], reference: Mapping[str, Tensor]) -> list[Finding]:
    """``per_rank[r][name]``: rank ``r``'s gradient of a parameter every rank holds whole; ``reference[name]``: the
    single-process gradient. Names ``SP_GRADS_NOT_REDUCED`` when they differ between ranks and sum to it."""
    names = sorted(reference)
    bad = [n for n in names if not all(_close(g[n], reference[n]) for g in per_rank)]
    if not bad:
        return []
    summed = [n for n in bad if _close(sum(g[n] for g in per_rank), reference[n])]
    if summed == bad:
        return [found(Pitfall.SP_GRADS_NOT_REDUCED, _("each rank holds a partial gradient"),
                      _("the gradients of {names} differ between the {world} ranks and their sum is the single-process gradient: "
                        "each rank saw only its own positions.").format(names=", ".join(bad), world=len(per_rank)))]
    return [found(Pitfall.GENERAL, _("replicated gradients are wrong"),
                  _("the gradients of {names} match neither the single-process gradient nor the sum of partial ones.").format(
                      names=", ".join(bad)), fix=_("compare the forward first: a wrong output gives wrong gradients"))]


def diagnose_ring_traffic(sent: int, q: Tensor, kv_heads: int, world: int, element_size: int | None = None) -> list[Finding]:
    """``sent``: bytes one rank's ring forward sent for its queries ``q [B, H, T/P, d]`` of a model with ``kv_heads`` K/V heads.
    Names ``KV_EXPANDED_BEFORE_RING`` when that is ``H / kv_heads`` times the narrow blocks' ``2 (P - 1)·B·kv·(T/P)·d·s``."""
    b, h, n, d = q.shape
    s = q.element_size() if element_size is None else element_size
    narrow = 2 * (world - 1) * b * kv_heads * n * d * s
    if sent == narrow:
        return []
    if kv_heads < h and sent == narrow * (h // kv_heads):
        return [found(Pitfall.KV_EXPANDED_BEFORE_RING, _("the ring sends every query head's K/V"),
                      _("{sent:,} bytes sent where the {kv} K/V heads need {narrow:,}: {ratio}× as much, the K/V heads were repeated "
                        "to {h} before the ring.").format(sent=sent, kv=kv_heads, narrow=narrow, ratio=h // kv_heads, h=h))]
    return [found(Pitfall.GENERAL, _("the ring sent an unexpected number of bytes"),
                  _("{sent:,} bytes sent; P - 1 = {hops} hops of the K and V blocks [{b}, {kv}, {n}, {d}] are {narrow:,}.").format(
                      sent=sent, hops=world - 1, b=b, kv=kv_heads, n=n, d=d, narrow=narrow),
                  fix=_("send each K/V block once per hop, P - 1 hops in the forward"))]
