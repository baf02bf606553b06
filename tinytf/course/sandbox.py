"""Run untrusted student code under limits: wall time, address space, file size, and no stragglers.

:func:`run_limited` starts a command in its own session with ``RLIMIT_AS`` (memory),
``RLIMIT_FSIZE`` (largest file it may write) and no core dumps, all inherited by the Jupyter kernel
it launches. Every process it starts carries a random ``TINYTF_JOB`` token in its environment;
when the command ends or runs past ``timeout`` the whole tree — including a kernel started in its
own session or anything a student forked into the background — is killed by that token.

This limits resources; it is not a security boundary: student code runs as the grading user and can
read what that user can read. Grade in a container or as a separate account (README, "For instructors").

The grader runs :mod:`tinytf.course.autograde_job` under those limits: one nbgrader autograde of one
submission in its own course root.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass

__all__ = ["Limits", "RunResult", "run_limited", "kill_job"]

JOB_ENV = "TINYTF_JOB"


@dataclass(frozen=True)
class Limits:
    """``timeout``: wall seconds for the whole command; ``memory_mb``: RLIMIT_AS per process;
    ``file_mb``: the largest file a process may write."""

    timeout: float = 600.0
    memory_mb: int = 4096
    file_mb: int = 256


@dataclass(frozen=True)
class RunResult:
    returncode: int | None  # None when it was killed for running out of time
    timed_out: bool
    seconds: float


def _preexec(limits: Limits):
    def apply() -> None:  # runs in the child between fork and exec
        mem = int(limits.memory_mb) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        size = int(limits.file_mb) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def kill_job(token: str, leader: int | None = None) -> int:
    """SIGKILL every process whose environment carries ``TINYTF_JOB=token`` (and ``leader``'s group)."""
    import psutil

    killed = 0
    if leader is not None:
        try:
            os.killpg(leader, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    me = os.getpid()
    for _ in range(3):  # a forking process may spawn while we sweep: sweep again
        found = 0
        for proc in psutil.process_iter(["pid"]):
            if proc.pid == me:
                continue
            try:
                if proc.environ().get(JOB_ENV) == token:
                    proc.kill()
                    found += 1
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                continue
        killed += found
        if not found:
            break
        time.sleep(0.05)
    return killed


def run_limited(
    cmd: list[str],
    limits: Limits,
    *,
    cwd: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    log: str | os.PathLike | None = None,
) -> RunResult:
    """Run ``cmd`` under ``limits``; stdout+stderr go to ``log`` (or are discarded)."""
    token = uuid.uuid4().hex
    env = dict(os.environ if env is None else env)
    env[JOB_ENV] = token
    start = time.monotonic()
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    try:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_preexec(limits),
        )
        try:
            rc: int | None = proc.wait(timeout=limits.timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            rc, timed_out = None, True
        kill_job(token, proc.pid)
        proc.wait()
    finally:
        if log:
            out.close()
    return RunResult(rc, timed_out, time.monotonic() - start)
