"""Exercise 11's ranks: a notebook's function run on real processes (gloo) or on simulated ranks (threads).

``torch.multiprocessing`` with the ``spawn`` start method (the only one that is safe with threads and
on every OS) sends a function to a child *by reference*: the pickle holds ``module.qualname`` and the
child imports it. A function defined in a Jupyter kernel lives in ``__main__``, which a child cannot
import, so :func:`tinytf.launch.run_processes` refuses it. Here the student's function travels *by
value* instead: :func:`ship` takes its compiled code (``marshal``, the same interpreter on both sides)
and the globals it names — modules by name, the notebook's own helper functions shipped the same way,
plain picklable values as they are — and :func:`unship` rebuilds it in the child. No source text is
needed, so it works in a kernel, under nbgrader and in a plain ``exec`` alike.

Four jobs (``JOBS``) run on each rank: the tensor-parallel attention with the student's QKV split
(part A), the student's row-parallel projection (part B), causal ring attention with the student's
merge of one K/V block (part C), and causal attention on the head group the student's Ulysses
all-to-all delivers (part D). :func:`on_processes` runs a job on ``P`` real processes (cached per
code and inputs: the self-check that re-runs a visible check does not start the processes again);
:func:`on_threads` runs it on ``P`` simulated ranks in this process, :class:`ThreadComm` standing in
for :class:`tinytf.collectives.Comm` (``all_reduce``, ``exchange`` and ``all_to_all``).
"""

from __future__ import annotations

import builtins
import hashlib
import importlib
import marshal
import math
import pickle
import threading
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ...translation import gettext as _

__all__ = ["ship", "unship", "ThreadComm", "on_threads", "on_processes", "JOBS",
           "attention_job", "row_job", "ring_job", "ulysses_job", "reference_attention"]

Tensor = torch.Tensor


def _names(code: types.CodeType) -> set[str]:
    """Every global name ``code`` and the functions nested in it may look up."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def ship(fn: Callable[..., Any], _seen: frozenset = frozenset()) -> dict[str, Any]:
    """A picklable description of the plain function ``fn`` (its code and the globals it names)."""
    if not isinstance(fn, types.FunctionType) or fn.__closure__:
        raise ValueError(_("{fn!r}: define it with `def` at the top level of the notebook (no closure, not a class)").format(fn=fn))
    env: dict[str, tuple[str, Any]] = {}
    for name in sorted(_names(fn.__code__) - set(_seen)):
        if name not in fn.__globals__:
            continue
        obj = fn.__globals__[name]
        if isinstance(obj, types.ModuleType):
            env[name] = ("module", obj.__name__)
        elif isinstance(obj, types.FunctionType) and obj.__globals__ is fn.__globals__ and not obj.__closure__:
            env[name] = ("function", ship(obj, _seen | {fn.__name__, name}))
        elif isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type)):
            env[name] = ("import", (obj.__module__, obj.__qualname__))
        else:
            try:
                env[name] = ("value", pickle.loads(pickle.dumps(obj)))
            except Exception:  # noqa: BLE001 - an unpicklable global is left out; using it raises NameError there
                continue
    return {"code": marshal.dumps(fn.__code__), "name": fn.__name__, "defaults": fn.__defaults__, "env": env}


def unship(payload: dict[str, Any]) -> Callable[..., Any]:
    """The function :func:`ship` described, with its globals rebuilt in this process."""
    glob: dict[str, Any] = {"__builtins__": builtins, "__name__": "__student__"}
    fn = types.FunctionType(marshal.loads(payload["code"]), glob, payload["name"], payload["defaults"])
    glob[payload["name"]] = fn  # a recursive function finds itself
    for name, (kind, what) in payload["env"].items():
        if kind == "module":
            glob[name] = importlib.import_module(what)
        elif kind == "function":
            glob[name] = unship(what)
        elif kind == "import":
            obj: Any = importlib.import_module(what[0])
            for part in what[1].split("."):
                obj = getattr(obj, part)
            glob[name] = obj
        else:
            glob[name] = what
    return fn


class ThreadComm:
    """Rank ``rank`` of ``world`` simulated ranks (threads of one process), with ``Comm``'s two operations."""

    def __init__(self, rank: int, world: int, board: list, barrier: threading.Barrier) -> None:
        self.rank, self.world, self._board, self._barrier = rank, world, board, barrier

    def _swap(self, item: Any) -> list:
        self._board[self.rank] = item
        self._barrier.wait()
        seen = list(self._board)
        self._barrier.wait()
        return seen

    def all_reduce(self, t: Tensor, phase: str = "forward") -> Tensor:
        """Sum ``t`` over the ranks, in place; returns it."""
        parts = self._swap(t.detach().clone())
        with torch.no_grad():
            t.copy_(torch.stack(parts).sum(0))
        return t

    def exchange(self, tensors: list[Tensor], phase: str = "forward") -> list[Tensor]:
        """Send ``tensors`` to rank + 1, receive rank - 1's."""
        return [x.clone() for x in self._swap([x.detach().clone() for x in tensors])[(self.rank - 1) % self.world]]

    def all_to_all(self, t: Tensor, phase: str = "forward") -> Tensor:
        """``t [P, ...]``: chunk ``j`` to rank ``j``; returns ``[P, ...]`` whose chunk ``i`` came from rank ``i``."""
        if not isinstance(t, Tensor) or t.dim() < 1 or t.size(0) != self.world:
            raise ValueError(_("all_to_all takes one chunk per rank along dim 0: [{world}, ...], got {shape}").format(
                world=self.world, shape=list(getattr(t, "shape", [])) or type(t).__name__))
        return torch.stack([part[self.rank].clone() for part in self._swap(t.detach().clone())])


# ---- the jobs: what one rank does (``comm`` real or simulated) -----------------------------------


def reference_attention(x: Tensor, w_qkv: Tensor, b_qkv: Tensor, w_proj: Tensor, b_proj: Tensor, heads: int,
                        kv_heads: int) -> Tensor:
    """Single-process causal attention of a fused ``qkv`` layer: ``x [B, T, D] -> [B, T, D]``."""
    from tinytf.parallel import local_attention

    d = w_qkv.size(0) // (heads + 2 * kv_heads)
    out = local_attention(F.linear(x, w_qkv, b_qkv), d, heads, kv_heads, heads // kv_heads, None, True, None)
    return F.linear(out, w_proj, b_proj)


def attention_job(rank: int, world: int, comm: Any, split: Callable, x: Tensor, w_qkv: Tensor, b_qkv: Tensor,
                  w_proj: Tensor, b_proj: Tensor, heads: int, kv_heads: int) -> Tensor:
    """Tensor-parallel attention on rank ``rank``, its QKV rows from ``split``; tinytf does the rest."""
    from tinytf.parallel import local_attention, shard_cols

    d = w_qkv.size(0) // (heads + 2 * kv_heads)
    w, b = split(w_qkv.clone(), rank, world, heads, kv_heads), split(b_qkv.clone(), rank, world, heads, kv_heads)
    if not isinstance(w, Tensor) or w.shape != (w_qkv.size(0) // world, w_qkv.size(1)):
        raise ValueError(_("split_qkv(weight {w_qkv_shape}, rank={rank}, world={world}) must return [{value}, {w_qkv_size}], got "
                           "{getattr}").format(w_qkv_shape=list(w_qkv.shape), rank=rank, world=world, value=w_qkv.size(0) // world,
                               w_qkv_size=w_qkv.size(1), getattr=getattr(w, 'shape', type(w).__name__)))
    out = local_attention(F.linear(x, w, b), d, heads // world, kv_heads // world, heads // kv_heads, None, True, None)
    y = F.linear(out, shard_cols(w_proj, rank, world))
    return comm.all_reduce(y) + b_proj


def row_job(rank: int, world: int, comm: Any, row_parallel: Callable, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """The student's row-parallel layer on rank ``rank``'s input columns of ``x`` and ``weight``."""
    from tinytf.parallel import shard_cols

    return row_parallel(shard_cols(x, rank, world).clone(), shard_cols(weight, rank, world).clone(), bias.clone(), comm)


def ring_job(rank: int, world: int, comm: Any, merge: Callable, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal ring attention (contiguous blocks of ``T / P``) on rank ``rank``, each arriving block merged by ``merge``."""
    from tinytf.ring import contiguous_layout, shard_sequence
    from tinytf.tiled import online_softmax_finish

    (chunk,) = contiguous_layout(q.size(-2), world)[rank]
    n = chunk[1] - chunk[0]
    q_r, k_r, v_r = (shard_sequence(z, [chunk]).clone() for z in (q, k, v))
    m = q_r.new_full((*q_r.shape[:-1], 1), -math.inf)
    l, acc = torch.zeros_like(m), q_r.new_zeros((*q_r.shape[:-1], v.size(-1)))
    for step in range(world):  # step 0: this rank's own block; then the block of rank (rank - step) mod P
        src = (rank - step) % world
        m, l, acc = merge(m, l, acc, q_r, k_r, v_r, rank * n, src * n)
        if step < world - 1:
            k_r, v_r = comm.exchange([k_r, v_r])
    return online_softmax_finish(m, l, acc)[0]


def ulysses_job(rank: int, world: int, comm: Any, seq_to_heads: Callable, q: Tensor, k: Tensor, v: Tensor) -> Any:
    """Causal attention on what the student's ``seq_to_heads`` makes of this rank's positions (a contiguous
    layout) of ``q, k, v [B, H, T, d]``: ``[B, H/P, T, d]`` when it is right; whatever shape it returns otherwise."""
    from tinytf.attention import scaled_dot_product_attention
    from tinytf.ring import contiguous_layout, shard_sequence

    (chunk,) = contiguous_layout(q.size(-2), world)[rank]
    q_h, k_h, v_h = (seq_to_heads(shard_sequence(z, [chunk]).clone(), comm) for z in (q, k, v))
    if not all(isinstance(t, Tensor) and t.dim() == 4 for t in (q_h, k_h, v_h)):
        raise ValueError(_("seq_to_heads must return a 4-D tensor [B, H/P, T, d], got {got}").format(
            got=getattr(q_h, "shape", type(q_h).__name__)))
    return scaled_dot_product_attention(q_h, k_h, v_h, is_causal=True)


JOBS: dict[str, Callable[..., Tensor]] = {"attention": attention_job, "row": row_job, "ring": ring_job, "ulysses": ulysses_job}


# ---- running a job on P ranks -------------------------------------------------------------------


def on_threads(job: str, fn: Callable[..., Any], world: int, *args: Any, timeout_s: float = 60.0) -> list[Tensor]:
    """``[rank 0's result, ...]`` of ``JOBS[job]`` on ``world`` simulated ranks (threads); a rank's error is raised."""
    board: list = [None] * world
    barrier = threading.Barrier(world, timeout=timeout_s)
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def one(rank: int) -> None:
        try:
            with torch.no_grad():
                results[rank] = JOBS[job](rank, world, ThreadComm(rank, world, board, barrier), fn, *args)
        except threading.BrokenBarrierError:
            pass  # another rank failed first: its error is the one to report
        except BaseException as err:  # noqa: BLE001 - re-raised below, in the caller's thread
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    if errors:
        raise errors[0]
    if any(r is None for r in results):
        raise TimeoutError(_("the {world} simulated ranks of {job} did not finish (a rank waits for a collective the others skip)").format(
            world=world, job=job))
    return results


def _rank_main(rank: int, world: int, job: str, payload: dict[str, Any], args: tuple) -> Any:
    """One process of :func:`on_processes`: rebuild the student's function and run the job on a real gloo Comm."""
    from tinytf.collectives import Comm

    try:
        with torch.no_grad():
            return ("ok", JOBS[job](rank, world, Comm(measure=False), unship(payload), *args))
    except Exception as err:  # noqa: BLE001 - sent back and raised in the notebook
        return ("error", type(err).__name__, str(err))


_CACHE: dict[str, list[Tensor]] = {}


def _fingerprint(obj: Any, h: Any) -> None:
    """Feed ``obj`` into the hash ``h`` by value: a tensor by dtype, shape and bytes (its pickle holds ids)."""
    if isinstance(obj, Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{list(t.shape)}".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}".encode())
        for x in obj:
            _fingerprint(x, h)
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}".encode())
        for k in sorted(obj, key=str):
            _fingerprint(k, h)
            _fingerprint(obj[k], h)
    else:
        h.update(pickle.dumps(obj))
_ERRORS = {"NotImplementedError": NotImplementedError, "ValueError": ValueError, "TypeError": TypeError,
           "IndexError": IndexError, "AttributeError": AttributeError, "NameError": NameError, "AssertionError": AssertionError}


def on_processes(job: str, fn: Callable[..., Any], world: int, *args: Any, timeout_s: float = 120.0) -> list[Tensor]:
    """``[rank 0's result, ...]`` of ``JOBS[job]`` on ``world`` real processes (gloo), the student's ``fn`` shipped
    by value. The same code on the same inputs is run once per kernel. A rank's error is raised here."""
    from tinytf.launch import run_processes

    payload = ship(fn)
    h = hashlib.sha256()
    _fingerprint((job, world, payload, args), h)
    key = h.hexdigest()
    if key not in _CACHE:
        got = run_processes(_rank_main, world, job, payload, args, timeout_s=timeout_s)
        for r, res in enumerate(got):
            if res[0] == "error":
                raise _ERRORS.get(res[1], RuntimeError)(_("on rank {r} of {world} processes: {res}: {res2}").format(r=r, world=world,
                    res=res[1], res2=res[2]))
        _CACHE[key] = [res[1] for res in got]
    return [t.clone() for t in _CACHE[key]]
