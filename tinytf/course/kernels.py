"""Jupyter kernels forked from a kernel zygote: the same fresh kernel, without paying its imports.

Every notebook we run (``tinytf validate``, each grading job, the executed chapters) gets a fresh
kernel. A fresh ``python -m ipykernel_launcher`` spends 1.5-3 s of CPU importing torch and ipykernel
before the first cell; over a class (or this repository's test suite: about 250 notebooks) that is most
of the cost of running the small notebooks of the exercises. A :class:`Zygote`
(:mod:`tinytf.course.kernel_zygote`) imports them once, runs nothing, and forks each kernel from that
clean state; :class:`ForkedKernelManager` launches :mod:`tinytf.course.kernel_client` in place of the
kernel, which stands in for it (signals, exit code, lifetime), so nbclient, nbgrader and papermill see
an ordinary kernel. The kernel takes the client's environment, folder and resource limits.

A zygote belongs to the process that started it and ends with it. Its address travels to child
processes in ``TINYTF_KERNEL_ZYGOTE`` (JSON: interpreter, socket, hash seed); a kernel is forked only
for the same interpreter and the same ``PYTHONHASHSEED`` (a grading run fixes it), else it is started
the usual way. ``TINYTF_KERNEL_ZYGOTE=off`` turns zygotes off.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager

__all__ = ["ENV", "Zygote", "shared_zygote", "with_zygote", "zygote_for_this_process", "ForkedKernelManager", "forked_command",
           "end_server"]

ENV = "TINYTF_KERNEL_ZYGOTE"
_HERE = Path(__file__).resolve().parent
_SERVER, _CLIENT = str(_HERE / "kernel_zygote.py"), str(_HERE / "kernel_client.py")  # both run by path
_LOCK = threading.Lock()
_OWNED: dict[str, Zygote] = {}  # hash seed -> the zygote this process started


class Zygote:
    """A running zygote started by this process with ``env``; :attr:`spec` is its ``TINYTF_KERNEL_ZYGOTE``."""

    def __init__(self, env: dict[str, str]) -> None:
        self.socket = str(Path(tempfile.gettempdir()) / f"tinytf-zygote-{uuid.uuid4().hex[:12]}.sock")
        read_end, self._lifeline = os.pipe()  # ours ends with this process, and so does the zygote
        env = {k: v for k, v in env.items() if k != ENV}
        self._proc = subprocess.Popen([sys.executable, _SERVER, self.socket, str(read_end)], pass_fds=(read_end,), env=env,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True)
        os.close(read_end)
        ready = self._proc.stdout.readline().strip() == b"ready" if self._proc.stdout else False
        if self._proc.stdout:
            self._proc.stdout.close()
        if not ready:
            self.stop()
            raise RuntimeError(f"the kernel zygote did not start (exit {self._proc.poll()})")
        self.spec = json.dumps({"python": sys.executable, "socket": self.socket, "hashseed": env.get("PYTHONHASHSEED", "")})

    def stop(self) -> None:
        """End the zygote and every kernel it made."""
        end_server(self._proc, self._lifeline)


def end_server(proc: subprocess.Popen, lifeline: Any) -> None:
    """End a server that runs until its ``lifeline`` (a file or a descriptor) closes: close it, wait up to
    10 s for ``proc`` to exit, else kill it (the zygote here, the fork server of :mod:`tinytf.course.sandbox`)."""
    try:
        lifeline.close() if hasattr(lifeline, "close") else os.close(lifeline)
    except OSError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def shared_zygote(env: dict[str, str] | None = None) -> Zygote | None:
    """This process's zygote for kernels with ``env``'s hash seed (started on first use; None if it cannot start)."""
    env = dict(os.environ if env is None else env)
    seed = env.get("PYTHONHASHSEED", "")
    with _LOCK:
        if seed not in _OWNED:
            try:
                _OWNED[seed] = Zygote(env)
            except (OSError, RuntimeError):
                return None
            atexit.register(_OWNED[seed].stop)
        return _OWNED[seed]


def with_zygote(env: dict[str, str]) -> dict[str, str]:
    """``env`` naming this process's zygote for kernels run with it (same hash seed) in ``TINYTF_KERNEL_ZYGOTE``;
    ``env`` as it is when that says ``off`` or no zygote can start."""
    zygote = shared_zygote(env) if env.get(ENV) != "off" else None
    return dict(env, **{ENV: zygote.spec}) if zygote is not None else env


def _usable(spec: str) -> str | None:
    """The socket of ``spec``'s zygote if kernels of this process may be forked from it."""
    try:
        info = json.loads(spec)
    except ValueError:
        return None
    same = info.get("python") == sys.executable and info.get("hashseed") == os.environ.get("PYTHONHASHSEED", "")
    return info["socket"] if same and os.path.exists(info.get("socket", "")) else None


def zygote_for_this_process() -> str | None:
    """The socket of the zygote this process's kernels fork from: the inherited one when it fits, else this
    process's own (started now, and announced to child processes in ``TINYTF_KERNEL_ZYGOTE``); None when off."""
    spec = os.environ.get(ENV, "")
    if spec == "off":
        return None
    if spec and (path := _usable(spec)):
        return path
    zygote = shared_zygote()
    if zygote is None:
        return None
    os.environ[ENV] = zygote.spec
    return zygote.socket


def forked_command(cmd: list[str], socket: str) -> list[str]:
    """``python -m ipykernel_launcher ARGS`` of this interpreter -> the client of ``socket``'s zygote (else ``cmd``)."""
    if len(cmd) >= 3 and os.path.abspath(cmd[0]) == os.path.abspath(sys.executable) and cmd[1:3] == ["-m", "ipykernel_launcher"]:
        return [sys.executable, "-I", "-S", _CLIENT, socket, *cmd[3:]]
    return cmd


class ForkedKernelManager(AsyncKernelManager):
    """An :class:`~jupyter_client.manager.AsyncKernelManager` whose kernels are forked from the zygote."""

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        socket = zygote_for_this_process()
        return forked_command(cmd, socket) if socket else cmd
