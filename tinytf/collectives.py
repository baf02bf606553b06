"""Collectives, counted: every call and every byte a rank sends, next to the ring algorithm's formulas.

With ``P`` ranks and a tensor of ``n`` bytes, the ring algorithm moves, per rank,

    all-reduce       2 (P - 1) / P · n      (a reduce-scatter, then an all-gather)
    reduce-scatter     (P - 1) / P · n      (n = the full input)
    all-gather         (P - 1) / P · n      (n = the full output)
    all-to-all         (P - 1) / P · n      (n = this rank's input: it keeps 1/P, sends the rest)
    send / recv                      n

— almost independent of ``P``: a bigger ring does not send more per rank, it only takes more steps.
gloo and NCCL do not report what they send, so :class:`Comm` can run the ring itself
(``measure=True``) over torch.distributed's point-to-point ``isend``/``irecv`` and count every byte;
with ``measure=False`` it calls ``dist.all_reduce`` and counts calls only. The all-to-all runs as
``dist.all_to_all_single`` (gloo has it on CPU) and counts the chunks that leave the rank.
:meth:`Comm.post_exchange` starts a ring step and returns at once (:class:`Pending`; ``wait()``
finishes it), so that a rank can compute while its blocks travel. Tensor parallelism needs
two conjugate autograd operations (Megatron-LM's *f* and *g*): :func:`copy_to_parallel` (identity
forward, all-reduce backward) and :func:`reduce_from_parallel` (all-reduce forward, identity backward).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

__all__ = [
    "Comm", "Traffic", "Pending", "all_reduce_bytes", "all_gather_bytes", "reduce_scatter_bytes", "all_to_all_bytes",
    "copy_to_parallel", "reduce_from_parallel",
]

Tensor = torch.Tensor


def all_reduce_bytes(nbytes: int, world: int) -> float:
    """Bytes each rank sends in a ring all-reduce of an ``nbytes`` tensor: ``2 (P - 1) / P · n``."""
    return 2 * (world - 1) * nbytes / world


def reduce_scatter_bytes(nbytes: int, world: int) -> float:
    """Bytes each rank sends in a ring reduce-scatter of an ``nbytes`` input: ``(P - 1) / P · n``."""
    return (world - 1) * nbytes / world


def all_gather_bytes(nbytes: int, world: int) -> float:
    """Bytes each rank sends in a ring all-gather into an ``nbytes`` output: ``(P - 1) / P · n``."""
    return (world - 1) * nbytes / world


def all_to_all_bytes(nbytes: int, world: int) -> float:
    """Bytes each rank sends in an all-to-all of its ``nbytes`` input: ``(P - 1) / P · n`` (chunk ``r`` stays)."""
    return (world - 1) * nbytes / world


@dataclass
class Traffic:
    """What one rank did: calls per ``(op, phase)``, bytes sent and received (measured), bytes sent per
    phase (``"forward"``, ``"backward"``, ``"weight_grad"`` …), and ``logical`` bytes per op (the sizes
    of the tensors handed to each collective)."""

    calls: Counter = field(default_factory=Counter)
    sent: int = 0
    received: int = 0
    logical: Counter = field(default_factory=Counter)
    sent_by_phase: Counter = field(default_factory=Counter)

    def _moved(self, sent: int, received: int, phase: str) -> None:
        self.sent += sent
        self.received += received
        self.sent_by_phase[phase] += sent

    def count(self, op: str, phase: str = "forward") -> int:
        """How many ``op`` calls (e.g. ``"all_reduce"``) happened in ``phase`` (``"forward"``/``"backward"``)."""
        return self.calls[op, phase]


class Comm:
    """A rank's view of a process group that counts what it sends.

    ``measure=True`` runs the ring algorithms over ``isend``/``irecv`` and counts real bytes;
    ``measure=False`` uses ``dist.all_reduce`` (the fast path) and counts calls and logical bytes.
    """

    def __init__(self, group: dist.ProcessGroup | None = None, *, measure: bool = True) -> None:
        self.group, self.measure = group, measure
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.traffic = Traffic()

    def reset(self) -> Traffic:
        """Start counting afresh; returns what was counted so far."""
        old, self.traffic = self.traffic, Traffic()
        return old

    def _peer(self, offset: int) -> int:
        """The global rank ``offset`` places along the ring."""
        r = (self.rank + offset) % self.world
        return r if self.group is None else dist.get_global_rank(self.group, r)

    def exchange(self, tensors: list[Tensor], phase: str = "forward") -> list[Tensor]:
        """Send ``tensors`` to the next rank of the ring and receive as many of the same shapes from
        the previous one (one step of a ring). Returns the received tensors."""
        return self.post_exchange(tensors, None, phase).wait()

    def post_exchange(self, send: list[Tensor], into: list[Tensor] | None = None, phase: str = "forward") -> Pending:
        """Start one ring step and return at once: ``send`` goes to rank + 1, tensors shaped like them come
        from rank - 1 into ``into`` (new tensors when ``None``). Until :meth:`Pending.wait` neither ``send``
        may be written nor ``into`` read or written: the transfer may still be using them."""
        if into is None:
            into = [_buffer(t) for t in send]
        elif [t.shape for t in send] != [t.shape for t in into] or not all(t.is_contiguous() for t in into):
            raise ValueError(f"a ring step receives into contiguous tensors shaped like those it sends: {[list(t.shape) for t in send]} "
                             f"vs {[list(t.shape) for t in into]}")
        self.traffic.calls["send_recv", phase] += 1
        return self._post(send, into, phase)

    def _post(self, send: list[Tensor], into: list[Tensor], phase: str) -> Pending:
        """isend ``send`` to rank+1, irecv ``into`` from rank-1; count the bytes."""
        send = [t.contiguous() for t in send]  # kept alive in Pending until the transfer is done
        ops = [dist.P2POp(dist.isend, t, self._peer(1), self.group) for t in send]
        ops += [dist.P2POp(dist.irecv, r, self._peer(-1), self.group) for r in into]
        self.traffic._moved(sum(t.nbytes for t in send), sum(r.nbytes for r in into), phase)
        return Pending(dist.batch_isend_irecv(ops), send, into)

    def _ring_step(self, send: list[Tensor], like: list[Tensor], phase: str) -> list[Tensor]:
        """One blocking ring step (the building block of the counted collectives)."""
        return self._post(send, [_buffer(t) for t in like], phase).wait()

    def all_to_all(self, t: Tensor, phase: str = "forward") -> Tensor:
        """``t [P, ...]``: chunk ``j`` goes to rank ``j``; returns ``[P, ...]`` whose chunk ``i`` came from
        rank ``i`` (``dist.all_to_all_single``). Counts the ``P - 1`` chunks that leave this rank."""
        if t.size(0) != self.world:
            raise ValueError(f"all_to_all takes one chunk per rank along dim 0: got {list(t.shape)} for P={self.world}; "
                             f"reshape to [{self.world}, ...] first")
        out = _buffer(t)
        if self.world > 1:
            dist.all_to_all_single(out, t.contiguous(), group=self.group)
        else:
            out.copy_(t)
        moved = t.nbytes - t[self.rank].nbytes
        self.traffic._moved(moved, moved, phase)
        self.traffic.calls["all_to_all", phase] += 1
        self.traffic.logical["all_to_all"] += t.nbytes
        return out

    def reduce_scatter(self, t: Tensor, phase: str = "forward") -> Tensor:
        """Ring reduce-scatter: rank ``r`` gets the sum over ranks of chunk ``r`` of ``t.flatten()``."""
        chunks = [c.clone() for c in t.flatten().tensor_split(self.world)]
        for step in range(self.world - 1):  # send chunk r-1-step, receive and add chunk r-2-step
            send, recv = (self.rank - step - 1) % self.world, (self.rank - step - 2) % self.world
            (got,) = self._ring_step([chunks[send]], [chunks[recv]], phase)
            chunks[recv] += got
        self.traffic.calls["reduce_scatter", phase] += 1
        self.traffic.logical["reduce_scatter"] += t.nbytes
        return chunks[self.rank]

    def all_gather(self, chunk: Tensor, sizes: list[int], phase: str = "forward") -> Tensor:
        """Ring all-gather of flat chunks (``sizes[r]`` elements from rank ``r``) into one flat tensor."""
        chunks = [chunk.new_empty(n) for n in sizes]
        chunks[self.rank] = chunk.flatten()
        for step in range(self.world - 1):  # send chunk r-step, receive chunk r-1-step
            send, recv = (self.rank - step) % self.world, (self.rank - step - 1) % self.world
            (chunks[recv],) = self._ring_step([chunks[send]], [chunks[recv]], phase)
        self.traffic.calls["all_gather", phase] += 1
        self.traffic.logical["all_gather"] += sum(sizes) * chunk.element_size()
        return torch.cat(chunks)

    def all_reduce(self, t: Tensor, phase: str = "forward") -> Tensor:
        """Sum ``t`` over all ranks, in place (and returned). Ring = reduce-scatter + all-gather."""
        if self.measure and self.world > 1:
            sizes = [c.numel() for c in t.flatten().tensor_split(self.world)]
            calls, logical = self.traffic.calls.copy(), self.traffic.logical.copy()
            t.copy_(self.all_gather(self.reduce_scatter(t, phase), sizes, phase).view_as(t))
            self.traffic.calls, self.traffic.logical = calls, logical  # one all-reduce, not its two halves
        else:
            dist.all_reduce(t, group=self.group)
        self.traffic.calls["all_reduce", phase] += 1
        self.traffic.logical["all_reduce"] += t.nbytes
        return t


def _buffer(like: Tensor) -> Tensor:
    """An empty contiguous tensor shaped like ``like`` (a transfer writes its bytes in order)."""
    return torch.empty_like(like, memory_format=torch.contiguous_format)


class Pending:
    """A ring step in flight (:meth:`Comm.post_exchange`). ``wait()`` blocks until it is done and returns
    the received tensors; after it the sent tensors may be reused."""

    def __init__(self, works: list, sent: list[Tensor], received: list[Tensor]) -> None:
        self._works, self._sent, self.received = works, sent, received

    def wait(self) -> list[Tensor]:
        for work in self._works:
            work.wait()
        self._works, self._sent = [], []
        return self.received


class _Conjugate(torch.autograd.Function):
    """A collective ``op`` forward whose gradient is its conjugate ``conj`` (all-gather <-> reduce-scatter, an
    all-to-all <-> its inverse): :func:`conjugate_exchange`."""

    @staticmethod
    def forward(ctx, x: Tensor, comm: Comm, op: Callable, conj: Callable) -> Tensor:
        ctx.comm, ctx.conj = comm, conj
        return op(x, comm, "forward")

    @staticmethod
    def backward(ctx, d_y: Tensor) -> tuple[Tensor, None, None, None]:
        return ctx.conj(d_y.contiguous(), ctx.comm, "backward"), None, None, None


def conjugate_exchange(x: Tensor, comm: Comm, op: Callable, conj: Callable) -> Tensor:
    """``op(x, comm, "forward")``, differentiable: the gradient is ``conj(d_y, comm, "backward")``. ``op`` and
    ``conj`` are each other's adjoint (what one sends where, the other brings back), as the sequence-parallel
    gather/scatter and Ulysses' two all-to-alls are."""
    return _Conjugate.apply(x, comm, op, conj)


class _CopyToParallel(torch.autograd.Function):
    """f: identity forward; backward sums the input gradient over the ranks."""

    @staticmethod
    def forward(ctx, x: Tensor, comm: Comm) -> Tensor:
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, d_y: Tensor) -> tuple[Tensor, None]:
        return ctx.comm.all_reduce(d_y.clone(), "backward"), None


class _ReduceFromParallel(torch.autograd.Function):
    """g: forward sums the partial results over the ranks; backward is the identity."""

    @staticmethod
    def forward(ctx, x: Tensor, comm: Comm) -> Tensor:
        return comm.all_reduce(x.clone(), "forward")

    @staticmethod
    def backward(ctx, d_y: Tensor) -> tuple[Tensor, None]:
        return d_y, None


def copy_to_parallel(x: Tensor, comm: Comm) -> Tensor:
    """Enter a tensor-parallel region: ``x`` unchanged; its gradient is all-reduced in backward (each
    rank's branch contributes a part of dL/dx)."""
    return _CopyToParallel.apply(x, comm)


def reduce_from_parallel(x: Tensor, comm: Comm) -> Tensor:
    """Leave a tensor-parallel region: the sum over ranks of each rank's partial ``x`` (one all-reduce);
    the gradient passes through unchanged (every rank needs all of it)."""
    return _ReduceFromParallel.apply(x, comm)
