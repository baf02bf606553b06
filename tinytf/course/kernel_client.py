"""The command a kernel manager launches instead of ``python -m ipykernel_launcher`` when a kernel zygote
(:mod:`tinytf.course.kernel_zygote`) is running: ``python -I -S kernel_client.py SOCKET ARGS...``.

Standard library only, so it starts in a few milliseconds. It asks the zygote for a kernel with its own
argv (``ARGS``: ``-f connection.json``), environment, folder, umask, niceness, resource limits and
stdio, then stands in for that kernel: the signals it gets (an interrupt's SIGINT, SIGTERM) go to the
kernel, and it exits with the kernel's exit code. The kernel lives only as long as this process: when
it ends in any way — even killed — the zygote kills the kernel.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import sys

LIMITS = ("RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_NOFILE", "RLIMIT_NPROC")  # as kernel_zygote's


def _request(argv: list[str]) -> bytes:
    umask = os.umask(0)
    os.umask(umask)
    return json.dumps({
        "argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "umask": umask, "nice": os.nice(0),
        "limits": {name: list(resource.getrlimit(getattr(resource, name))) for name in LIMITS},
    }).encode() + b"\n"


def main(path: str, argv: list[str]) -> int:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    socket.send_fds(conn, [_request(argv)], [0, 1, 2])
    reader = conn.makefile("rb")
    first = json.loads(reader.readline() or b"{}")
    pid = first.get("pid")
    if not pid:
        print("tinytf kernel client: the kernel zygote did not start a kernel", file=sys.stderr)
        return 1
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda signum, _frame: os.kill(pid, signum))
    while True:
        try:
            line = reader.readline()
        except InterruptedError:
            continue
        if not line:  # the zygote ended (and with it the kernel)
            return 1
        msg = json.loads(line)
        if "exit" in msg:
            return int(msg["exit"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
