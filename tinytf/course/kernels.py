"""Jupyter kernels forked from a kernel zygote: the same fresh kernel, without paying its imports.

Every notebook we run (``tinytf validate``, each grading job, the executed chapters) gets a fresh
kernel. A fresh ``python -m ipykernel_launcher`` spends 1.5-3 s of CPU importing torch and ipykernel
before the first cell; over a class (or this repository's test suite: about 250 notebooks) that is most
of the cost of running the small notebooks of the exercises. A :class:`Zygote`
(:mod:`tinytf.course.kernel_zygote`) imports them once, runs nothing, and forks each kernel from that
clean state; :class:`ForkedKernelManager` launches :mod:`tinytf.course.kernel_client` in place of the
kernel, which stands in for it (signals, exit code, lifetime), so nbclient, nbgrader and papermill see
an ordinary kernel. The kernel takes the client's environment, folder and resource limits. Its client
(:class:`ReadyKernelClient`) starts work when the kernel says it is ready, not after jupyter_client's
timers (0.2-0.6 s a kernel), and its manager notices a killed kernel's exit within milliseconds.

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
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from queue import Empty
from typing import Any

from jupyter_client import protocol_version
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager
from traitlets import default

__all__ = ["ENV", "Zygote", "shared_zygote", "with_zygote", "zygote_for_this_process", "ForkedKernelManager", "ReadyKernelClient",
           "forked_command", "end_server"]

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


class ReadyKernelClient(AsyncKernelClient):
    """An :class:`~jupyter_client.asynchronous.AsyncKernelClient` that knows the kernel is ready when it says so.

    jupyter_client's ``wait_for_ready`` reads the ``kernel_info`` reply, then one IOPub message (0.2 s
    to wait for it, else it starts over), then reads IOPub until it has been quiet for 0.2 s: every
    kernel start waits 0.2-0.6 s on timers. Here the wait ends on the kernel's ``idle`` status for a
    ``kernel_info`` request, on IOPub: IOPub is connected, and everything published before it (the
    request's ``busy``, any start-up output) has been read. The first reply usually comes before IOPub
    has connected (ZeroMQ retries a connection every 0.1 s), so its ``idle`` is lost: a request whose
    reply does not come within 1 s, or its ``idle`` within 0.05 s after it, is sent again (any one's
    ``idle`` will do).
    """

    async def wait_for_ready(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
        sent: set[str] = set()
        while True:
            sent.add(self.kernel_info())
            replied = await self._kernel_info_reply(sent, min(time.monotonic() + 1.0, deadline))  # jupyter_client: 1 s
            if replied and await self._idle(sent, min(time.monotonic() + 0.05, deadline)):
                return
            if not await self.is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout:g} seconds")

    async def _kernel_info_reply(self, sent: set[str], until: float) -> bool:
        """Read the shell channel until the reply to one of ``sent`` (True) or ``until`` passes (False)."""
        msg = await _first(self.shell_channel, until,
                           lambda m: m["msg_type"] == "kernel_info_reply" and m["parent_header"].get("msg_id") in sent)
        if msg is not None:
            major = int(msg["content"].get("protocol_version", protocol_version).split(".")[0])
            if major != int(protocol_version.split(".")[0]):
                self.session.adapt_version = major  # as jupyter_client does for an older kernel
        return msg is not None

    async def _idle(self, sent: set[str], until: float) -> bool:
        """Read IOPub until the ``idle`` status of one of ``sent`` (True) or ``until`` passes (False)."""
        def idle(m: dict) -> bool:
            return (m["msg_type"] == "status" and m["content"].get("execution_state") == "idle"
                    and m["parent_header"].get("msg_id") in sent)

        return await _first(self.iopub_channel, until, idle) is not None


async def _first(channel: Any, until: float, wanted: Callable[[dict], bool]) -> dict | None:
    """The first message of ``channel`` that is ``wanted`` (those before it are read and dropped), or None at ``until``."""
    while (left := until - time.monotonic()) > 0:
        try:
            msg = await channel.get_msg(timeout=left)
        except Empty:
            return None
        if wanted(msg):
            return msg
    return None


class ForkedKernelManager(AsyncKernelManager):
    """An :class:`~jupyter_client.manager.AsyncKernelManager` whose kernels are forked from the zygote
    (and whose clients are :class:`ReadyKernelClient`)."""

    @default("client_factory")
    def _ready_client(self) -> type:
        return ReadyKernelClient

    async def _async_wait(self, pollinterval: float = 0.1) -> None:
        # jupyter_client's wait for a killed kernel to exit, which polls every 0.1 s: a forked kernel's stand-in
        # exits within milliseconds of the kill, so poll every 5 ms (at most 5 s: the caller's timeout)
        await super()._async_wait(pollinterval=min(pollinterval, 0.005))

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        socket = zygote_for_this_process()
        return forked_command(cmd, socket) if socket else cmd
