"""``python papermill_run.py IN OUT CWD DEVICE KERNEL TIMEOUT``: papermill's command line, with the
kernel forked from the kernel zygote this process inherited (``TINYTF_KERNEL_ZYGOTE``, see
:mod:`tinytf.course.kernels`) when there is one.

Run by path, importing nothing of tinytf's package (``import tinytf`` imports torch, which a papermill
client does not need): :mod:`tinytf.course.kernels` is loaded from its file. A failing cell exits 1 with
the partial notebook written, as ``papermill`` does.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # run by path: our notebook.py would shadow Jupyter's `notebook`
    _HERE = __import__("os").path.dirname(__import__("os").path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if __import__("os").path.abspath(p or ".") != _HERE]

import importlib.util
import logging
import os


def _forked_manager() -> dict:
    """``{"kernel_manager_class": ForkedKernelManager}`` when a zygote was inherited, else ``{}``."""
    if os.environ.get("TINYTF_KERNEL_ZYGOTE", "off") == "off":
        return {}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels.py")
    spec = importlib.util.spec_from_file_location("tinytf_course_kernels", path)
    kernels = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(kernels)  # type: ignore[union-attr]
    return {"kernel_manager_class": kernels.ForkedKernelManager}


def main(argv: list[str]) -> int:
    src, out, cwd, device, kernel, timeout = argv
    sys.modules.setdefault("rfc3987_syntax", None)  # 1.5-2 s of Lark grammars per run: see tinytf.course.notebook.skip_slow_imports
    import papermill

    logging.getLogger("papermill").setLevel(logging.WARNING)
    try:
        papermill.execute_notebook(src, out, parameters={"device": device}, kernel_name=kernel, cwd=cwd, progress_bar=False,
                                   execution_timeout=int(timeout), **_forked_manager())
    except papermill.PapermillExecutionError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
