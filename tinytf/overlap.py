"""How much of the ring's communication a rank waits for: the ring timed blocking, overlapped, and silent.

A rank's ring forward takes ``t = compute + exposed communication``. Timing the same call three ways, in
rounds (so that all three see the same load), isolates the exposed part:

* ``blocking``: :func:`tinytf.ring_attention` — compute a block, then exchange it;
* ``overlapped``: ``overlap=True`` — post the next exchange, compute, then wait (a double buffer);
* ``silent``: the same loop with a :class:`SilentRing` that passes nothing (each rank folds its own block
  ``P`` times: the same tiles, no transfer) — the compute alone.

``exposed = t - t_silent`` per round; the medians over the rounds and their ratio are returned. Timings
say something about *this* machine only (chapter 12 prints them with the conditions): they are measured in
``make bench`` and in the chapter, never asserted by a test.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch
import torch.distributed as dist

from .bench import percentile
from .collectives import Comm
from .ring import Layout, ring_attention

__all__ = ["SilentRing", "ring_overlap_times", "overlap_job"]

Tensor = torch.Tensor
VARIANTS = ("blocking", "overlapped", "silent")


class SilentRing:
    """A ring that sends nothing: ``exchange`` hands back the tensors it was given (for timing the compute alone)."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    def exchange(self, tensors: list[Tensor], phase: str = "forward") -> list[Tensor]:
        return tensors

    def post_exchange(self, send: list[Tensor], into: list[Tensor] | None = None, phase: str = "forward") -> SimpleNamespace:
        return SimpleNamespace(wait=lambda: send)


def ring_overlap_times(q: Tensor, k: Tensor, v: Tensor, *, layout: Layout, comm: Comm, repeats: int = 15, warmup: int = 2,
                       is_causal: bool = False) -> dict:
    """Time this rank's ring forward blocking, overlapped and silent, ``repeats`` rounds after ``warmup``; every
    rank must call it together (a barrier starts each run). Returns the per-variant times (s), their p50s, the
    p50 of the exposed communication ``t - t_silent`` per round for blocking and overlapped, and
    ``ratio = overlapped exposed / blocking exposed``; the outputs of the two rings are checked equal first."""
    silent = SilentRing(comm.rank, comm.world)
    runs = {"blocking": lambda: ring_attention(q, k, v, layout=layout, comm=comm, is_causal=is_causal),
            "overlapped": lambda: ring_attention(q, k, v, layout=layout, comm=comm, is_causal=is_causal, overlap=True),
            "silent": lambda: ring_attention(q, k, v, layout=layout, comm=silent, is_causal=is_causal)}
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with torch.no_grad():
        if not torch.equal(runs["blocking"](), runs["overlapped"]()):
            raise RuntimeError("the overlapped ring differs from the blocking one: not timing it")
        for i in range(warmup + repeats):
            for name in VARIANTS:
                dist.barrier(group=comm.group)
                start = time.perf_counter()
                runs[name]()
                if i >= warmup:
                    times[name].append(time.perf_counter() - start)
    exposed = {name: percentile([t - s for t, s in zip(times[name], times["silent"])], 50) for name in ("blocking", "overlapped")}
    return {"times": times, "p50": {name: percentile(ts, 50) for name, ts in times.items()}, "exposed": exposed,
            "ratio": exposed["overlapped"] / exposed["blocking"] if exposed["blocking"] > 0 else float("nan"),
            "repeats": repeats, "warmup": warmup}


def overlap_job(rank: int, world: int, heads: int, tokens_per_rank: int, head_dim: int, repeats: int) -> dict:
    """One rank of a timing job (for :func:`tinytf.launch.run_processes`): random ``q, k, v [1, heads, T/P, d]``
    on a contiguous layout of ``T = tokens_per_rank · P``, timed by :func:`ring_overlap_times`."""
    torch.manual_seed(rank)
    q, k, v = (torch.randn(1, heads, tokens_per_rank, head_dim) for _ in range(3))
    layout = [[(r * tokens_per_rank, (r + 1) * tokens_per_rank)] for r in range(world)]
    return ring_overlap_times(q, k, v, layout=layout, comm=Comm(), repeats=repeats)
