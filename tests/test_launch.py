"""tinytf.launch: spawned jobs return each rank's result in rank order; torchrun runs a worker script
and its results come back from files; what cannot be launched says why."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch.distributed as dist

from tinytf.launch import backend_for, run_processes, torchrun, torchrun_command


def _rank_and_sum(rank: int, world: int, scale: float) -> tuple[int, int, float]:
    import torch

    t = torch.tensor([scale * (rank + 1)])
    dist.all_reduce(t)
    return rank, world, t.item()


def test_run_processes_returns_every_rank_in_order():
    assert run_processes(_rank_and_sum, 2, 2.0) == [(0, 2, 6.0), (1, 2, 6.0)]


def test_local_functions_are_refused():
    def local(rank, world):
        return rank

    with pytest.raises(ValueError, match="module level"):
        run_processes(local, 2)
    with pytest.raises(ValueError, match="positive"):
        run_processes(_rank_and_sum, 0)


def test_torchrun_command_and_backend():
    cmd = torchrun_command(2)
    assert cmd[-3:] == ["--standalone", "--nproc-per-node", "2"]
    assert cmd[0].endswith("torchrun") or cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert backend_for("cpu") == "gloo"


def test_torchrun_reads_each_rank_back(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        import torch.distributed as dist
        from tinytf.launch import rank_result_path
        dist.init_process_group("gloo")
        t = torch.tensor([dist.get_rank() + 1.0])
        dist.all_reduce(t)
        torch.save({"rank": dist.get_rank(), "sum": t.item(), "arg": sys.argv[2]}, rank_result_path(sys.argv[1], dist.get_rank()))
        dist.destroy_process_group()
    """))
    assert torchrun(script, tmp_path / "out", "hello") == [{"rank": 0, "sum": 3.0, "arg": "hello"}, {"rank": 1, "sum": 3.0, "arg": "hello"}]
    script.write_text("raise SystemExit('no such luck')\n")
    with pytest.raises(RuntimeError, match="no such luck"):
        torchrun(script, tmp_path / "out")
