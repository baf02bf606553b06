"""The fork server of :class:`tinytf.course.sandbox.ForkServer`: a process that imports nbgrader once
and forks one limited child per job, so no job pays those imports.

Run by path (``python fork_server.py MODULE ...``), importing nothing of tinytf: it imports the
modules named on its command line, answers ``ready``, then reads one JSON request a line and for each
forks a child that starts a new session, takes the limits (:func:`apply_limits`), the job's
environment, folder and log, and runs the job script; it answers ``pid N`` once the child leads its
own session and ``rc R`` when the child and everything it started have ended. The server runs no job
itself, so every job is forked from the same clean state; on Linux it is a subreaper and kills
whatever is left below it before it reports a job done.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run by path as the server: our notebook.py would shadow Jupyter's `notebook`
    _HERE = __import__("os").path.dirname(__import__("os").path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if __import__("os").path.abspath(p or ".") != _HERE]

import json
import os
import resource
import time

__all__ = ["apply_limits", "write_all", "serve"]


def apply_limits(memory_mb: int, file_mb: int) -> None:
    """Limit this process (and what it starts): ``RLIMIT_AS`` of ``memory_mb``, files of at most
    ``file_mb``, no core dumps. Every sandboxed process takes these: :func:`tinytf.course.sandbox.run_limited`'s
    between fork and exec, and each job the server forks (here, since the server imports nothing of tinytf)."""
    mem = int(memory_mb) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    size = int(file_mb) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _run_job(req: dict) -> int:
    """In the forked child: the job's session, limits, environment, folder and log, then its script."""
    import runpy

    apply_limits(req["memory_mb"], req["file_mb"])
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


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to the file descriptor ``fd`` (unbuffered: ``os.write`` may write part)."""
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


def _warm_nbformat() -> None:
    """Compile nbformat's notebook schema validators once here (what every autograde compiles again for
    itself otherwise: about 0.5 s a job), when nbformat was preloaded."""
    if "nbformat" not in sys.modules:
        return
    import nbformat

    nb = nbformat.v4.new_notebook()
    for relax in (False, True):  # nbgrader validates with and without relax_add_props
        nbformat.validate(nb, relax_add_props=relax)


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
    _warm_nbformat()
    write_all(chan, b"ready\n")
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
        write_all(chan, f"pid {pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        _kill_descendants()
        write_all(chan, f"rc {os.waitstatus_to_exitcode(status)}\n".encode())


if __name__ == "__main__":  # pragma: no cover
    serve(sys.argv[1:])
