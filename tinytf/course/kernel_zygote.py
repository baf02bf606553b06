"""The kernel zygote: a process that has imported torch and ipykernel once, runs no code of anyone's,
and forks one fresh Jupyter kernel per request, so no kernel pays those imports (1.5-3 s of CPU each).

Run by path (``python kernel_zygote.py SOCKET LIFELINE_FD``), importing nothing of tinytf. It preloads
:data:`PRELOAD`, listens on the Unix socket ``SOCKET`` and answers each client
(:mod:`tinytf.course.kernel_client`, the command a kernel manager launches) with a forked kernel:

- the request carries the client's argv for ``ipykernel_launcher``, its environment, folder, umask,
  niceness and resource limits, and (as file descriptors) its stdin, stdout and stderr;
- the child leads a new session, dies with the zygote (``PR_SET_PDEATHSIG``), takes all of those — the
  limits of a grading sandbox included, since the client inherited them — reseeds numpy, and becomes the
  kernel; the zygote answers ``{"pid": N}``, later ``{"exit": CODE}``;
- the connection is the kernel's lifeline: when the client ends (a kernel manager's kill, a sandbox
  that kills its job) the zygote kills the kernel's whole session;
- when the process that started the zygote ends (``LIFELINE_FD`` reaches end of file) it kills every
  kernel it made and exits.

Each kernel is forked from the same clean state (copy-on-write, from a process that never ran a cell),
so no state passes from one notebook's kernel to another's. matplotlib is not preloaded: it reads the
``matplotlibrc`` of the folder it is imported in.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run by path: our notebook.py would shadow Jupyter's `notebook`
    _HERE = __import__("os").path.dirname(__import__("os").path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if __import__("os").path.abspath(p or ".") != _HERE]

import json
import os
import resource
import selectors
import signal
import socket

__all__ = ["PRELOAD", "serve"]

PRELOAD = ("numpy", "torch", "ipykernel.kernelapp", "ipykernel.ipkernel")
_INF = resource.RLIM_INFINITY


def _lower(a: int, b: int) -> int:
    """The lower of two resource limits (``RLIM_INFINITY`` is above every number)."""
    return b if a == _INF else a if b == _INF else min(a, b)


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no kernel outlives the zygote
    except (OSError, AttributeError):
        pass


def _take(req: dict, fds: list[int]) -> None:
    """In the forked child: the client's stdio, session, limits, environment, folder and interpreter path."""
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)
    os.setsid()
    _die_with_parent()
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    keep = {0, 1, 2}
    for name in os.listdir("/proc/self/fd"):  # no other client's connection, no listening socket
        if int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass
    for name, (soft, hard) in req["limits"].items():  # the client's limits (a sandbox's), never above ours
        kind = getattr(resource, name)
        hard = _lower(hard, resource.getrlimit(kind)[1])
        resource.setrlimit(kind, (_lower(soft, hard), hard))
    os.nice(max(0, int(req["nice"]) - os.nice(0)))
    os.umask(int(req["umask"]))
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:] = [req["cwd"], *extra, *sys.path]  # as `python -m ipykernel_launcher` run there would have it


def _become_kernel(req: dict, fds: list[int]) -> None:
    """The child's life: set up, reseed, run the kernel until it shuts down, exit without returning."""
    code = 1
    try:
        _take(req, fds)
        import numpy
        import torch

        numpy.random.seed()  # a fresh interpreter's numpy is seeded from the OS, not inherited
        if os.environ.get("OMP_NUM_THREADS", "").isdigit():
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        import ipykernel.kernelapp as app

        # its parent is the zygote: ipykernel read JPY_PARENT_PID when we imported it, so say so (it then
        # watches the zygote, and does not print the note for a kernel started by hand)
        sys.argv = [app.__file__, *req["argv"], f"--IPKernelApp.parent_handle={os.getppid()}"]
        app.launch_new_instance()
        code = 0
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
    except BaseException:  # noqa: BLE001 - shown on the client's stderr, as an uncaught error of a fresh kernel
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _send(conn: socket.socket | None, msg: dict) -> None:
    if conn is not None:
        try:
            conn.sendall(json.dumps(msg).encode() + b"\n")
        except OSError:
            pass


class _Zygote:
    """The select loop: new clients, ended clients (kill their kernels), ended kernels, the owner's end."""

    def __init__(self, path: str, lifeline: int) -> None:
        self.sel = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "child")
        self.sel.register(lifeline, selectors.EVENT_READ, "owner")
        self.kernels: dict[int, socket.socket | None] = {}  # kernel pid -> its client's connection

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(10)
        try:
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            while not data.endswith(b"\n"):
                more = conn.recv(1 << 20)
                if not more:
                    raise OSError("client closed mid-request")
                data += more
            req = json.loads(data)
        except (OSError, ValueError):
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _become_kernel(req, fds)
        for fd in fds:
            os.close(fd)
        conn.settimeout(None)
        self.kernels[pid] = conn
        self.sel.register(conn, selectors.EVENT_READ, pid)
        _send(conn, {"pid": pid})

    def client_ended(self, conn: socket.socket, pid: int) -> None:
        if conn.recv(4096):
            return  # clients send nothing after the request; ignore stray bytes
        self.sel.unregister(conn)
        conn.close()
        self.kernels[pid] = None
        _kill_session(pid)

    def reap(self) -> None:
        os.read(self.wake_r, 4096)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            _kill_session(pid)  # what the kernel left running in its session goes with it
            conn = self.kernels.pop(pid, None)
            if conn is not None:
                _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
                self.sel.unregister(conn)
                conn.close()

    def run(self) -> None:
        while True:
            for key, _ in self.sel.select():
                if key.data == "accept":
                    self.accept()
                elif key.data == "child":
                    self.reap()
                elif key.data == "owner":
                    if not os.read(key.fd, 4096):
                        for pid in list(self.kernels):
                            _kill_session(pid)
                        return
                else:
                    self.client_ended(key.fileobj, key.data)  # type: ignore[arg-type]


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the kernel leads its session: its group is its pid
    except (ProcessLookupError, PermissionError):
        pass


def serve(path: str, lifeline: int) -> None:
    """Preload, then answer clients on ``path`` until the owner's ``lifeline`` ends."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    zygote = _Zygote(path, lifeline)
    print("ready", flush=True)
    try:
        zygote.run()
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the owner; it ends us by the lifeline
    serve(sys.argv[1], int(sys.argv[2]))
