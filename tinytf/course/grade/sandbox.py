"""Where a submission's code runs when it is graded: a Jupyter kernel in bubblewrap, under limits.

:func:`autograde` runs stock ``nbgrader autograde`` on one submission (in a worker of the grading pool); nbgrader
starts the notebook's kernel through jupyter_client from the kernelspec :func:`write_kernelspec` writes for the job,
whose command wraps the kernel in ``prlimit`` (``RLIMIT_AS``, ``RLIMIT_FSIZE``, no core dumps) and, in mode
``"bwrap"``, in bubblewrap (the sandbox Flatpak uses): no network (a loopback of its own), its own PID and IPC
namespaces, a read-only view of the system, the Python installation and the ``tinytf`` package, a private
``/tmp`` and one writable work folder; nothing else exists inside (not ``solutions/``, the gradebook, the course
root's source notebooks or another student's submission). The kernel talks to nbgrader through IPC sockets in a
folder they share. Mode ``"none"`` keeps the limits only; ``"auto"`` is ``"bwrap"`` where bubblewrap works and
otherwise says once that grading runs with resource limits only. The whole-notebook wall limit ends the job
(:func:`kill_job`: every process that carries its ``TINYTF_JOB`` token), and what a job leaves running is killed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ...translation import gettext as _
from ..exercises import REPO

__all__ = ["MODES", "Limits", "Job", "SandboxRun", "sandbox_mode", "bwrap_works", "kernel_command", "write_kernelspec",
           "kill_job", "autograde"]

MODES = ("auto", "bwrap", "none")
JOB_ENV = "TINYTF_JOB"
KERNEL = "tinytf-sandbox"  # the kernelspec each job gets


@dataclass(frozen=True)
class Limits:
    """``timeout``: wall seconds for the whole notebook; ``memory_mb``: RLIMIT_AS of the kernel;
    ``file_mb``: the largest file it may write."""

    timeout: float = 600.0
    memory_mb: int = 4096
    file_mb: int = 256


@dataclass(frozen=True)
class Job:
    """One submission to grade: its private course root ``root`` (a copy of the gradebook, the source notebook,
    the copy nbgrader grades), the ``submission`` as handed in (outside the root), the ``course`` root of its
    edition (read only), nbgrader's ``config``, and the ``limits`` and sandbox ``mode`` (``"bwrap"`` or ``"none"``)
    it runs under. ``student`` is its nbgrader id, ``display`` the folder name the gradebook shows."""

    root: Path
    exercise: str
    student: str
    display: str
    name: str
    edition: str
    submission: Path
    course: Path
    config: dict
    limits: Limits
    mode: str

    @property
    def records(self) -> Path:  # what the hidden tests record (tinytf.course.reference.judging)
        return self.root.parent / f"{self.root.name}.records"

    @property
    def home(self) -> Path:  # the kernel's home: IPython's and matplotlib's folders
        return self.root.parent / f"{self.root.name}.home"

    @property
    def runtime(self) -> Path:  # the connection file and the kernel's sockets (a short path: 108 bytes per socket)
        return self.root.parent / f"{self.root.name}.rt"

    @property
    def workdir(self) -> Path:  # where nbgrader runs the notebook
        return self.root / "autograded" / self.student / self.exercise


@dataclass(frozen=True)
class SandboxRun:
    """How a job's run ended: ``timed_out`` (the whole-notebook limit), nbgrader's ``success`` and its ``log``."""

    timed_out: bool
    success: bool
    log: str
    seconds: float


@functools.cache
def bwrap_works() -> bool:
    """Whether bubblewrap can start a sandbox like the kernels' here (it needs unprivileged user namespaces,
    or root; containers often forbid them)."""
    if shutil.which("bwrap") is None:
        return False
    try:
        probe = subprocess.run(["bwrap", "--unshare-all", "--die-with-parent", "--proc", "/proc", "--dev", "/dev", *_system_binds(),
                                *_python_binds(), "--", sys.executable, "-S", "-c", "pass"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


_SAID: set[str] = set()


def sandbox_mode(requested: str = "auto", lang: str | None = None) -> str:
    """``"bwrap"`` or ``"none"`` for ``tinytf grade --sandbox requested``; ``"auto"`` says once (in ``lang``, by default
    the instructor's: ``TINYTF_LANG``) when it falls back to the limits alone. ValueError for ``"bwrap"`` where it cannot run."""
    if requested not in MODES:
        raise ValueError(_("--sandbox {mode}: choose one of {modes}", lang).format(mode=requested, modes=", ".join(MODES)))
    if requested == "none":
        return "none"
    if bwrap_works():
        return "bwrap"
    why = (_("bubblewrap (bwrap) is not installed: apt-get install bubblewrap", lang) if shutil.which("bwrap") is None
           else _("bubblewrap cannot create its namespaces here (a container without user namespaces?)", lang))
    if requested == "bwrap":
        raise ValueError(_("--sandbox bwrap: {why}", lang).format(why=why))
    if "auto" not in _SAID:
        _SAID.add("auto")
        print(_("tinytf grade: {why}; grading runs with resource limits only (time, memory, file size): student code can "
                "read what this user can read and use the network. See the README, \"The grading sandbox\".", lang).format(why=why),
              file=sys.stderr)
    return "none"


def _system_binds() -> list[str]:
    """A read-only view of the system: /usr and its links, the few /etc files a Python program reads, /sys."""
    args: list[str] = []
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for name in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "fonts", "passwd", "group", "nsswitch.conf", "localtime",
                 "hosts", "mime.types", "ssl", "alternatives"):
        if os.path.exists(f"/etc/{name}"):
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    return args + ["--ro-bind", "/sys", "/sys"]


def _python_binds() -> list[str]:
    """Read-only: this interpreter's installation and environment, the tinytf package and the released exercises
    (the notebook's self-check compares with them); nothing else of the repository."""
    import tinytf

    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent,
             Path(tinytf.__file__).resolve().parent, REPO / "exercises"}
    paths = {p for p in paths if p.exists() and not any(q != p and p.is_relative_to(q) for q in paths)}
    return [arg for p in sorted(paths) for arg in ("--ro-bind", str(p), str(p))]


def kernel_command(job: Job) -> list[str]:
    """The kernelspec's ``argv`` of ``job``'s kernel: prlimit, then (mode bwrap) bubblewrap, then ipykernel."""
    kernel = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    limits = []
    if shutil.which("prlimit"):
        mem, size = job.limits.memory_mb * 1024 ** 2, job.limits.file_mb * 1024 ** 2
        limits = ["prlimit", f"--as={mem}", f"--fsize={size}", "--core=0", "--"]
    if job.mode != "bwrap":
        return limits + kernel
    writable = [job.workdir, job.records, job.home, job.runtime]
    sandbox = ["bwrap", "--unshare-all", "--die-with-parent", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
               *_system_binds(), *_python_binds(), *[a for p in writable for a in ("--bind", str(p), str(p))],
               "--chdir", str(job.workdir), "--"]
    # in its own PID namespace the kernel's parent is bwrap's init (PID 1): ipykernel would take that for its parent
    # having died. parent_handle=1 is ipykernel's "a parent that never goes away" (no watch, no console banner);
    # bwrap's --die-with-parent ends the kernel with the grader instead
    return limits + sandbox + kernel + ["--IPKernelApp.parent_handle=1"]


def write_kernelspec(job: Job, token: str) -> Path:
    """``<root>/jupyter/kernels/tinytf-sandbox/kernel.json``: how nbgrader starts ``job``'s kernel (found through
    ``JUPYTER_PATH``). ``interrupt_mode: message``: a cell's time limit interrupts the kernel through its control
    channel (a signal to the process group would reach bubblewrap, not the kernel)."""
    for folder in (job.records, job.home / "mpl", job.home / "ipython", job.runtime):
        folder.mkdir(parents=True, exist_ok=True)
    _seed_font_cache(job.home / "mpl")
    env = {JOB_ENV: token, "TINYTF_RECORD_DIR": str(job.records), "TINYTF_LANG": job.edition, "HOME": str(job.home),
           "MPLCONFIGDIR": str(job.home / "mpl"), "IPYTHONDIR": str(job.home / "ipython"), "TMPDIR": "/tmp"}
    spec = {"argv": kernel_command(job), "display_name": "tinytf grading sandbox", "language": "python",
            "interrupt_mode": "message" if job.mode == "bwrap" else "signal", "env": env}
    path = job.root / "jupyter" / "kernels" / KERNEL / "kernel.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec, indent=1), encoding="utf-8")
    return path.parent.parent.parent


def _seed_font_cache(folder: Path) -> None:
    """A copy of matplotlib's font list for the kernel's own config folder (building it costs seconds a kernel)."""
    cache = Path(os.environ.get("MPLCONFIGDIR") or Path.home() / ".cache" / "matplotlib")
    for found in cache.glob("fontlist-*.json"):
        shutil.copyfile(found, folder / found.name)


def kill_job(token: str) -> int:
    """SIGKILL every process whose environment carries ``TINYTF_JOB=token`` (a kernel, bubblewrap, what they started)."""
    import psutil

    killed = 0
    for _sweep in range(3):  # a forking process may spawn while we sweep: sweep again
        found = 0
        for proc in psutil.process_iter():
            try:
                if proc.pid != os.getpid() and proc.environ().get(JOB_ENV) == token:
                    proc.kill()
                    found += 1
            except (psutil.Error, OSError):
                continue
        killed += found
        if not found:
            break
        time.sleep(0.05)
    return killed


def autograde(job: Job) -> SandboxRun:
    """``nbgrader autograde`` of ``job``'s one submission with its kernel in the sandbox, stopped at the
    whole-notebook limit; everything the job started is killed before it returns."""
    from nbgrader.apps import NbGraderAPI
    from traitlets.config import Config

    from ..ipynb import kernel_config

    token = uuid.uuid4().hex
    os.environ["JUPYTER_PATH"] = str(write_kernelspec(job, token))  # this worker runs one job at a time
    config = Config(job.config)
    config.merge(kernel_config(job.runtime))  # IPC sockets in the folder the sandbox shares with nbgrader
    config.KernelManager.connection_file = str(job.runtime / "kernel.json")
    config.Execute.kernel_name = KERNEL
    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        kill_job(token)

    timer = threading.Timer(job.limits.timeout, stop)
    start = time.monotonic()
    timer.start()
    try:
        with _output_to(job.root / "autograde.log"):  # nbgrader's log and the kernel's own output (not the notebook's)
            (job.root / "exchange").mkdir(exist_ok=True)
            api = NbGraderAPI(config=config)
            api.log.setLevel(logging.WARNING)
            result = api.autograde(job.exercise, job.student, force=True, create=True)
    finally:
        timer.cancel()
        kill_job(token)
    log = (result.get("log") or "")[-4000:] + (result.get("error") or "")[-4000:]
    return SandboxRun(stopped.is_set(), bool(result.get("success")), log, time.monotonic() - start)


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """This process's stdout and stderr (file descriptors 1 and 2, which the kernels it starts inherit) into ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (log, *saved):
            os.close(fd)
