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
(this file run by path, importing nothing of tinytf) imports nbgrader once, runs no job itself, and
forks one child per job; the child starts a new session, takes the limits, the job's environment,
folder and log, and runs the job script. Each job is still its own process, forked from the same
clean state (copy-on-write, never from a process that ran a job), and the student code still runs
in the Jupyter kernel the job starts (a fresh interpreter); the wall limit and the kill of the whole
tree are :func:`run_limited`'s, and the server (a subreaper on Linux) kills whatever is left below
it before it reports a job done.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run by path as the server: our notebook.py would shadow Jupyter's `notebook`
    _HERE = __import__("os").path.dirname(__import__("os").path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if __import__("os").path.abspath(p or ".") != _HERE]

import json
import os
import resource
import select
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass

__all__ = ["Limits", "RunResult", "run_limited", "kill_job", "ForkServer"]

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


def _apply_limits(memory_mb: int, file_mb: int) -> None:
    mem = int(memory_mb) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    size = int(file_mb) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _preexec(limits: Limits):
    def apply() -> None:  # runs in the child between fork and exec
        _apply_limits(limits.memory_mb, limits.file_mb)

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


def _run_job(req: dict) -> int:
    """In the forked child: the job's session, limits, environment, folder and log, then its script."""
    import runpy

    _apply_limits(req["memory_mb"], req["file_mb"])
    os.chdir(req["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if req["log"] else os.open(os.devnull, os.O_WRONLY)
    for fd, target in ((null, 0), (log, 1), (log, 2)):
        os.dup2(fd, target)
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = list(req["argv"])
    try:
        runpy.run_path(req["argv"][0], run_name="__main__")
        code = 0
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in the log, like an uncaught error in a fresh interpreter
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _write(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _adopt_orphans() -> None:
    """Linux: this process becomes a subreaper, so a job's orphans (even re-sessioned ones) stay its
    descendants, which :func:`_kill_descendants` can find."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass  # elsewhere only the TINYTF_JOB sweep of kill_job remains


def _kill_descendants() -> None:
    """SIGKILL and reap every process left below the server (the job has ended or been killed)."""
    import psutil

    for _ in range(100):
        kids = psutil.Process().children(recursive=True)
        for kid in kids:
            try:
                kid.kill()
            except psutil.Error:
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if not kids:
            return
        time.sleep(0.02)


def serve(preload: list[str]) -> None:
    """The server loop: import ``preload``; per request line (JSON) fork a child that runs the job;
    answer ``pid N`` once the child leads its own session, then ``rc R`` when it and everything it
    started have ended."""
    import importlib

    _adopt_orphans()
    chan = os.dup(1)  # the replies; fd 1 goes to /dev/null so that nothing an import prints mixes in
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    sys.modules.setdefault("rfc3987_syntax", None)  # see tinytf.course.notebook.skip_slow_imports
    for name in preload:
        importlib.import_module(name)
    _write(chan, b"ready\n")
    for line in sys.stdin.buffer:
        req = json.loads(line)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.close(ready_r)
                os.close(chan)  # the server's channel is not the job's (fd 0 is replaced in _run_job)
                os.setsid()
                os.write(ready_w, b"x")
                os.close(ready_w)
                code = _run_job(req)
            finally:
                os._exit(code)  # no interpreter shutdown: a second or more saved, nothing left to flush
        os.close(ready_w)
        os.read(ready_r, 1)  # the child leads its own session now: killpg(pid) reaches it
        os.close(ready_r)
        _write(chan, f"pid {pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        _kill_descendants()
        _write(chan, f"rc {os.waitstatus_to_exitcode(status)}\n".encode())


class ForkServer:
    """A server process that imports ``preload`` once and forks one limited child per :meth:`run`;
    one job at a time (use one server per worker). ``env``: the server's environment (each job gets
    its own). :meth:`run` returns what :func:`run_limited` would; a server that cannot start falls
    back to :func:`run_limited`."""

    def __init__(self, preload: list[str], env: dict[str, str] | None = None) -> None:
        env = {k: v for k, v in (os.environ if env is None else env).items() if k != JOB_ENV}
        self._proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), *preload], env=env, bufsize=0,
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
            _write(self._proc.stdin.fileno(), (json.dumps(req) + "\n").encode())
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
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


if __name__ == "__main__":  # pragma: no cover
    serve(sys.argv[1:])
