"""Run a function on N real processes — the way tests (spawn) and chapters (torchrun) start a job.

:func:`run_processes` starts ``world`` Python processes with ``torch.multiprocessing``, joins them
into one gloo process group and returns what ``fn(rank, world, *args)`` returned on each rank. Where
the platform has it, the processes come from multiprocessing's *forkserver*: a clean process started
once per interpreter that has imported torch, forking each rank (a spawned rank would import torch
anew, 1.5-3 s of CPU each, at every call); elsewhere they are spawned.
:func:`torchrun` launches a worker script with ``torchrun --standalone --nproc-per-node N`` (the
launcher users run; ``python -m torch.distributed.run`` when ``torchrun`` is not installed next to
this Python) and reads each rank's result back from ``out_dir/rank{r}.pt``.
"""

from __future__ import annotations

import importlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["run_processes", "torchrun", "torchrun_command", "free_port", "backend_for", "rank_result_path"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (for the rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_for(device: str) -> str:
    """``"nccl"`` when ``device`` is CUDA and there are at least two GPUs, else ``"gloo"`` (CPU)."""
    return "nccl" if str(device).startswith("cuda") and torch.cuda.device_count() >= 2 else "gloo"


def rank_result_path(out_dir: str | Path, rank: int) -> Path:
    """Where rank ``rank`` saves its result: ``out_dir/rank{rank}.pt``."""
    return Path(out_dir) / f"rank{rank}.pt"


def _entry(rank: int, target: tuple[str, str], world: int, args: tuple, port: int, backend: str,
           out_dir: str, path: list[str], threads: int) -> None:
    """Child process: rebuild sys.path, import fn by name, join the group, run, save the result."""
    sys.path[:] = path
    torch.set_num_threads(threads)
    module, name = target
    fn = importlib.import_module(module)
    for part in name.split("."):
        fn = getattr(fn, part)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        result = fn(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    torch.save(result, rank_result_path(out_dir, rank))


def _start_method() -> str:
    """``"forkserver"`` (its server preloads torch and this module once) where there is one, else ``"spawn"``."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", __name__])
    return "forkserver"


def run_processes(fn: Callable[..., Any], world: int = 2, *args: Any, backend: str = "gloo",
                  timeout_s: float = 120.0, threads: int = 1) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` new processes; returns ``[result of rank 0, ...]``.

    ``fn`` must be a module-level function (the children import it by name); ``args`` and the results
    travel by pickling (tensors included). A rank that raises makes this raise with its traceback; a job
    still running after ``timeout_s`` is killed and raises ``TimeoutError``.
    """
    if world < 1:
        raise ValueError(f"world must be a positive number of processes, got world={world}")
    if getattr(fn, "__module__", "__main__") == "__main__" or "<locals>" in fn.__qualname__:
        raise ValueError(f"{fn!r} must be defined at module level in an importable module (the children import it by name)")
    with tempfile.TemporaryDirectory(prefix="tinytf-ranks-") as out_dir:
        ctx = mp.start_processes(
            _entry, args=((fn.__module__, fn.__qualname__), world, args, free_port(), backend, out_dir, list(sys.path), threads),
            nprocs=world, join=False, start_method=_start_method(),
        )
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=max(0.0, deadline - time.monotonic())):  # True once every rank has exited
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{fn.__qualname__} on {world} processes did not finish within {timeout_s} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        return [torch.load(rank_result_path(out_dir, r), weights_only=False) for r in range(world)]


def torchrun_command(nproc: int = 2) -> list[str]:
    """``[torchrun, --standalone, --nproc-per-node, N]``, or ``[python, -m, torch.distributed.run, ...]``."""
    beside = Path(sys.executable).with_name("torchrun")
    exe = str(beside) if beside.exists() else shutil.which("torchrun")
    head = [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]
    return [*head, "--standalone", "--nproc-per-node", str(nproc)]


def torchrun(script: str | Path, out_dir: str | Path, *args: str, nproc: int = 2, timeout_s: float = 120.0) -> list[Any]:
    """Launch ``script out_dir *args`` on ``nproc`` processes with torchrun; return each rank's result.

    The script saves its result with ``torch.save(obj, rank_result_path(out_dir, rank))``. A failed
    launch raises ``RuntimeError`` with the end of its output.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for r in range(nproc):
        rank_result_path(out_dir, r).unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [*torchrun_command(nproc), str(script), str(out_dir), *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return [torch.load(rank_result_path(out_dir, r), weights_only=False) for r in range(nproc)]

