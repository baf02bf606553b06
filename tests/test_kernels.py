"""Kernels forked from the zygote are fresh kernels: their own process, folder, environment and limits,
nothing left from the kernel before, and they end with the process that stands in for them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from queue import Empty

import nbformat
import pytest
from nbclient import NotebookClient

from tinytf.course import kernels
from tinytf.course.notebook import kernel_config

pytestmark = pytest.mark.slow  # real kernels (a second or two each once the zygote runs)


def _run(cells: list[str], cwd: Path, **env: str) -> list[str]:
    """Each cell's stdout, run in one forked kernel in ``cwd`` (``env`` added to this process's for the run)."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    config = kernel_config()
    assert config.NotebookClient.kernel_manager_class == "tinytf.course.kernels.ForkedKernelManager", "kernel_config forks"
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        NotebookClient(nb, kernel_name="python3", config=config, resources={"metadata": {"path": str(cwd)}}).execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return ["".join(o.get("text", "") for o in c.outputs if o.get("name") == "stdout").strip() for c in nb.cells]


def _gone(pid: int, within: float = 30.0) -> bool:
    """Whether process ``pid`` has ended (or is a zombie) within ``within`` seconds: waits for the event."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z"):
                return True
        except (OSError, IndexError):
            return True
        time.sleep(0.05)
    return False


def test_a_forked_kernel_is_a_fresh_kernel_in_its_own_folder_and_environment(tmp_path):
    (tmp_path / "helper_mod.py").write_text("VALUE = 41\n", encoding="utf-8")
    first = _run(["import os, sys, torch, numpy; print(os.getcwd()); print(sys.path[0])",
                  "import helper_mod; print(helper_mod.VALUE + 1)",
                  "print(os.environ.get('TINYTF_ZYGOTE_TEST'), torch.get_num_threads())",
                  "import resource; print(resource.getrlimit(resource.RLIMIT_FSIZE)[0])",
                  "leftover = 'from the first notebook'; print(os.getpid(), numpy.random.randint(1 << 30))"],
                 tmp_path, TINYTF_ZYGOTE_TEST="seen", OMP_NUM_THREADS="1")
    assert first[0] == f"{tmp_path}\n{tmp_path}", "the kernel runs in the notebook's folder, which is first on sys.path"
    assert first[1] == "42" and first[2] == "seen 1"
    second = _run(["import os, numpy; print('leftover' in globals(), os.getpid(), numpy.random.randint(1 << 30))"], tmp_path)
    gone, pid, draw = second[0].split()
    assert gone == "False", "nothing of the first notebook's kernel is in the second's"
    assert pid != first[4].split()[0] and draw != first[4].split()[1], "its own process, its own numpy seed"


PROBE = """
import resource
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
import nbformat
from nbclient import NotebookClient
from tinytf.course.notebook import kernel_config
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import resource; print(resource.getrlimit(resource.RLIMIT_FSIZE))")])
NotebookClient(nb, kernel_name="python3", config=kernel_config()).execute()
print(nb.cells[0].outputs[0]["text"].strip())
"""


def test_the_kernel_takes_the_limits_of_the_process_standing_in_for_it():
    """A grading sandbox limits the job; the job's kernel manager launches the client, which passes them on
    (here: a process that lowered its file-size limit, using this process's zygote)."""
    assert kernels.zygote_for_this_process() and os.environ.get(kernels.ENV), "the zygote is announced to child processes"
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == f"({1 << 20}, {1 << 20})", out.stdout + out.stderr


def test_killing_the_stand_in_kills_the_kernel_and_what_it_started():
    asyncio.run(_kill_the_stand_in())


async def _kill_the_stand_in() -> None:
    km = kernels.ForkedKernelManager(kernel_name="python3")
    km.update_env(env={"OMP_NUM_THREADS": "1"})
    await km.start_kernel()
    client = km.client()
    client.start_channels()
    await client.wait_for_ready(timeout=60)
    pids: list[int] = []
    reply = await client.execute_interactive(
        "import os, time\nchild = os.fork()\nif child == 0:\n    time.sleep(600)\n    os._exit(0)\nprint(os.getpid(), child)",
        output_hook=lambda msg: pids.extend(int(p) for p in msg["content"].get("text", "").split()), timeout=60)
    assert reply["content"]["status"] == "ok" and len(pids) == 2
    stand_in = km.provisioner.process.pid
    assert stand_in not in pids, "the kernel is forked from the zygote, not the launched process"
    os.kill(stand_in, signal.SIGKILL)
    assert _gone(pids[0]) and _gone(pids[1]), "the kernel and its background child end with the stand-in"
    client.stop_channels()
    await km.cleanup_resources()


def test_only_this_interpreters_kernels_with_the_same_hash_seed_are_forked(monkeypatch):
    socket = kernels.zygote_for_this_process()
    assert socket and os.path.exists(socket)
    launcher = [sys.executable, "-m", "ipykernel_launcher", "-f", "c.json"]
    assert kernels.forked_command(launcher, socket)[-3:] == [socket, "-f", "c.json"]
    other = ["/opt/other/bin/python", "-m", "ipykernel_launcher", "-f", "c.json"]
    assert kernels.forked_command(other, socket) == other, "another interpreter's kernel starts as usual"
    assert kernels.forked_command(["R", "--slave"], socket) == ["R", "--slave"]
    spec = json.loads(os.environ[kernels.ENV])
    monkeypatch.setenv("PYTHONHASHSEED", "12345" if spec["hashseed"] != "12345" else "54321")
    assert kernels._usable(os.environ[kernels.ENV]) is None, "a run with another hash seed gets its own zygote"
    monkeypatch.setenv(kernels.ENV, "off")
    assert kernels.zygote_for_this_process() is None
    assert kernel_config().NotebookClient.get("kernel_manager_class") is None, "off: kernels start the usual way"


def test_the_zygote_ends_with_the_process_that_started_it(tmp_path):
    code = ("import os, sys; from tinytf.course import kernels; z = kernels.shared_zygote(); "
            "print(z._proc.pid, z.socket, flush=True); sys.stdin.read()")
    owner = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={k: v for k, v in os.environ.items() if k != kernels.ENV})
    pid, socket = owner.stdout.readline().split()
    assert os.path.exists(socket)
    owner.kill()
    owner.wait()
    assert _gone(int(pid)), "the zygote sees its owner's lifeline end and exits"


def test_kernels_are_ready_at_once_and_the_first_cell_s_output_arrives(tmp_path):
    """Each kernel's client is a ReadyKernelClient (ready on the kernel's idle status, not after timers),
    and the first cell of a fresh kernel loses no output: IOPub was connected when it said ready."""
    km = kernels.ForkedKernelManager()
    assert km.client_factory is kernels.ReadyKernelClient
    for k in range(4):
        assert _run([f"print('first {k}')", "print('second')"], tmp_path) == [f"first {k}", "second"]


def _status(parent: str, state: str) -> dict:
    return {"msg_type": "status", "content": {"execution_state": state}, "parent_header": {"msg_id": parent}}


def _reply(parent: str, protocol: str = "5.4") -> dict:
    return {"msg_type": "kernel_info_reply", "content": {"protocol_version": protocol}, "parent_header": {"msg_id": parent}}


class _Channel:
    """A channel holding scripted messages; empty, it says so at once (nothing here waits on a clock)."""

    def __init__(self) -> None:
        self.queue: list[dict] = []

    async def get_msg(self, timeout: float | None = None) -> dict:
        if not self.queue:
            raise Empty
        return self.queue.pop(0)


class _ScriptedClient(kernels.ReadyKernelClient):
    """``script[n]`` says what the kernel answers to the n-th kernel_info request: shell and IOPub messages."""

    shell_channel = None  # plain attributes here, in place of jupyter_client's channel properties
    iopub_channel = None

    def __init__(self, script, alive: bool = True) -> None:
        super().__init__()
        self.shell_channel, self.iopub_channel, self.script, self.alive, self.sent = _Channel(), _Channel(), script, alive, []

    def kernel_info(self) -> str:
        msg_id = f"info-{len(self.sent)}"
        self.sent.append(msg_id)
        shell, iopub = self.script(msg_id, len(self.sent)) if self.alive else ([], [])
        self.shell_channel.queue += shell
        self.iopub_channel.queue += iopub
        return msg_id

    async def is_alive(self) -> bool:
        return self.alive


def test_ready_client_sends_again_when_iopub_missed_the_idle_and_drains_what_came_before():
    def iopub_late(msg_id, n):  # the first request's IOPub messages are lost (IOPub not connected yet)
        start = [{"msg_type": "stream", "content": {"text": "start-up"}, "parent_header": {}}]
        return [_reply(msg_id)], ([] if n == 1 else start + [_status(msg_id, "busy"), _status(msg_id, "idle")])

    client = _ScriptedClient(iopub_late)
    asyncio.run(client.wait_for_ready(timeout=30))
    assert client.sent == ["info-0", "info-1"], "one request more, after the lost idle"
    assert client.iopub_channel.queue == [] and client.shell_channel.queue == [], "nothing of the start-up is left to read"


def test_ready_client_ready_on_the_first_idle_and_adapts_to_an_older_protocol():
    client = _ScriptedClient(lambda msg_id, n: ([_reply(msg_id, "4.1")], [_status(msg_id, "busy"), _status(msg_id, "idle")]))
    asyncio.run(client.wait_for_ready(timeout=30))
    assert client.sent == ["info-0"] and client.session.adapt_version == 4


def test_ready_client_ignores_another_request_s_idle_and_reports_a_dead_kernel():
    stranger = _ScriptedClient(lambda msg_id, n: ([_reply(msg_id)], [_status("someone-else" if n < 3 else msg_id, "idle")]))
    asyncio.run(stranger.wait_for_ready(timeout=30))
    assert len(stranger.sent) == 3, "an idle status of another request is no proof of this one"
    with pytest.raises(RuntimeError, match="died"):
        asyncio.run(_ScriptedClient(lambda msg_id, n: ([], []), alive=False).wait_for_ready(timeout=30))
