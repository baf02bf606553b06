"""The judging processes of ``tinytf grade``: ``jobs`` clean ``python -I -m tinytf.course.finish``
processes, started with the run at a lower priority, each judging the jobs sent to it on stdin as
soon as their sandboxes have ended (:mod:`tinytf.course.finish` runs no student code)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["FINISH_MAIN", "Finishers", "finish_all", "lower_priority"]

# `python -I -m tinytf.course.finish`, of this very tinytf (-I ignores PYTHONPATH and the folder it runs in)
FINISH_MAIN = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r}); import runpy; "
               "runpy.run_module('tinytf.course.finish', run_name='__main__', alter_sys=True)")


def lower_priority() -> None:
    """In a judging process before it starts: nice 10, so that while it imports and judges, the kernels
    of the sandboxes still running keep the CPU (a kernel starved on a busy machine misses its timeouts)."""
    os.nice(10)


class Finishers:
    """``jobs`` clean judging processes (``python -I -m tinytf.course.finish``, at a lower priority);
    :meth:`send` gives each job to the least loaded one, as soon as its sandbox has ended. ``course``:
    the run's English course root; ``work``: the run's work folder (``finish-K.log`` go there);
    ``env``: the run's environment; ``judge_files``: extra judges each process loads."""

    def __init__(self, course: Path, work: Path, env: dict[str, str], judge_files: list[str], jobs: int) -> None:
        cmd = [sys.executable, "-I", "-c", FINISH_MAIN, "--course", str(course)]
        for f in judge_files:
            cmd += ["--judge-file", f]
        clean_env = {k: v for k, v in env.items() if k != "TINYTF_RECORD_DIR"}
        self.procs = []
        for k in range(jobs):
            with (work / f"finish-{k}.log").open("wb") as log:
                self.procs.append(subprocess.Popen(cmd, cwd=work, env=clean_env, stdin=subprocess.PIPE,
                                                   stdout=log, stderr=subprocess.STDOUT, preexec_fn=lower_priority))
        self.sent = [0] * jobs

    def send(self, item: dict) -> None:
        k = self.sent.index(min(self.sent))
        self.sent[k] += 1
        try:
            self.procs[k].stdin.write((json.dumps(item) + "\n").encode())
            self.procs[k].stdin.flush()
        except OSError:
            pass  # a judging process that died: its jobs are reported as grader errors

    def close(self) -> None:
        for proc in self.procs:
            try:
                proc.stdin.close()
            except OSError:
                pass


def finish_all(finishers: Finishers) -> None:
    """Wait for the judging processes to judge every job sent to them (a job without result.json
    is reported as a grader error)."""
    finishers.close()
    for proc, n in zip(finishers.procs, finishers.sent):
        try:
            proc.wait(timeout=600 + 120 * n)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
