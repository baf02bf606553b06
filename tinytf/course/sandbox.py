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

:class:`ForkServer` runs the same jobs without paying the job's imports each time: a server process
(:mod:`tinytf.course.fork_server`, run by path, importing nothing of tinytf) imports nbgrader once,
runs no job itself, and forks one child per job. Each job is still its own process, forked from the
same clean state (copy-on-write, never from a process that ran a job), and the student code still
runs in the Jupyter kernel the job starts (a fresh interpreter); the wall limit and the kill of the
whole tree are :func:`run_limited`'s.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

from .fork_server import apply_limits, write_all

__all__ = ["Limits", "RunResult", "run_limited", "kill_job", "ForkServer"]

JOB_ENV = "TINYTF_JOB"
_SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fork_server.py")  # run by path


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
        apply_limits(limits.memory_mb, limits.file_mb)

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


class ForkServer:
    """A server process that imports ``preload`` once and forks one limited child per :meth:`run`;
    one job at a time (use one server per worker). ``env``: the server's environment (each job gets
    its own). :meth:`run` returns what :func:`run_limited` would; a server that cannot start falls
    back to :func:`run_limited`."""

    def __init__(self, preload: list[str], env: dict[str, str] | None = None) -> None:
        env = {k: v for k, v in (os.environ if env is None else env).items() if k != JOB_ENV}
        self._proc = subprocess.Popen([sys.executable, _SERVER, *preload], env=env, bufsize=0,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._state = "starting"

    def _line(self, timeout: float | None) -> str | None:
        """The server's next reply line (read byte by byte: nothing is buffered past it), or None
        after ``timeout`` seconds."""
        fd = self._proc.stdout.fileno()
        deadline = None if timeout is None else time.monotonic() + timeout
        got = b""
        while not got.endswith(b"\n"):
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], wait)[0]:
                return None
            byte = os.read(fd, 1)
            if not byte:
                self._state = "dead"
                raise EOFError("the fork server has ended")
            got += byte
        return got.decode().strip()

    def run(self, cmd: list[str], limits: Limits, *, cwd: str | os.PathLike, env: dict[str, str],
            log: str | os.PathLike | None = None) -> RunResult:
        """Run the Python script ``cmd[1]`` with arguments ``cmd[2:]`` (``cmd[0]``: this interpreter)."""
        token = uuid.uuid4().hex
        req = {"argv": cmd[1:], "cwd": str(cwd), "env": dict(env, **{JOB_ENV: token}), "log": str(log) if log else "",
               "memory_mb": limits.memory_mb, "file_mb": limits.file_mb}
        try:
            if self._state == "starting":  # the server's imports are not the job's time
                self._state = "ready" if self._line(None) == "ready" else "dead"
            if self._state != "ready":
                raise EOFError
            start = time.monotonic()
            write_all(self._proc.stdin.fileno(), (json.dumps(req) + "\n").encode())
            pid = int(self._line(None).split()[1])
        except (OSError, EOFError, ValueError, IndexError):
            self._state = "dead"
            return run_limited(cmd, limits, cwd=cwd, env=env, log=log)
        try:
            reply = self._line(limits.timeout - (time.monotonic() - start))
            timed_out = reply is None
            kill_job(token, pid)  # the kernel and anything it left behind
            if timed_out:
                reply = self._line(None)
        except EOFError:
            kill_job(token, pid)
            raise RuntimeError("the fork server ended while it ran a job") from None
        return RunResult(None if timed_out else int(reply.split()[1]), timed_out, time.monotonic() - start)

    def close(self) -> None:
        """End the server (its jobs have ended: :meth:`run` waits for each)."""
        from .kernels import end_server

        end_server(self._proc, self._proc.stdin)

