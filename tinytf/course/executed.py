"""Executed copies of notebooks in ``build/executed/``: run once, reused while nothing they depend on changed.

:func:`execute` runs one notebook with papermill the way the book needs it (the inline backend, so each
figure is an ``image/png`` output; ``TINYTF_HEADLESS=1``, so widgets are their static figures; one
thread), into ``build/executed/<path under notebooks/>``. A copy is reused when it is newer than its
source *and* its stored :func:`execution_key` matches: a hash of the notebook, of the ``tinytf`` package's
files and of these options, so a library change re-executes. ``make book`` and
``python -m tinytf.course.book --execute-only`` use it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .nbgrader_root import REPO
from .notebook import load_json, write_atomic

__all__ = ["EXECUTED", "OPTIONS", "executed_path", "execution_key", "missing_glyphs", "execute", "execute_all", "main"]

EXECUTED = REPO / "build" / "executed"
PACKAGE = REPO / "tinytf"
INLINE = "module://matplotlib_inline.backend_inline"  # figures become image/png outputs (Agg would leave "<Figure size ...>")
# what the executor does, in the key: changing it re-executes every copy
OPTIONS = {"backend": INLINE, "headless": "1", "kernel": "python3", "threads": "1", "version": 2}
_PAPERMILL = str(Path(__file__).resolve().parent / "papermill_run.py")  # papermill with a forked kernel (run by path)
_BUILDERS = ("executed.py", "book.py")  # this module and the book's: no chapter imports them; OPTIONS holds what they do to a run


def executed_path(nb: Path, root: Path = EXECUTED) -> Path:
    """``root/<path under notebooks/>`` (``root/<path under the repository>`` for anything else, e.g.
    ``solutions/zh/ex01_by_hand.ipynb``), as ``make run`` names them. ``root``: ``build/executed/``."""
    nb = Path(nb).resolve()
    if not nb.is_relative_to(REPO):
        raise ValueError(f"{nb} is not in the repository {REPO}: executed copies are named by their path in it")
    base = REPO / "notebooks" if nb.is_relative_to(REPO / "notebooks") else REPO
    return Path(root) / nb.relative_to(base)


@functools.lru_cache(maxsize=1)
def _package_digest() -> str:
    """sha256 of every file of the ``tinytf`` package (path and bytes); caches and the builders
    (``course/executed.py``, ``course/book.py``) left out."""
    h = hashlib.sha256()
    files = (p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    for f in sorted(p for p in files if p.relative_to(PACKAGE).as_posix() not in {f"course/{b}" for b in _BUILDERS}):
        h.update(f.relative_to(PACKAGE).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def execution_key(nb: Path, device: str = "cpu") -> str:
    """What an executed copy depends on: the notebook's bytes, its folder's ``matplotlibrc`` (the fonts its
    figures are drawn with), the ``tinytf`` package, the device and the executor's options. A copy with
    another key is executed again."""
    h = hashlib.sha256(Path(nb).read_bytes())
    rc = Path(nb).parent / "matplotlibrc"
    h.update(rc.read_bytes() if rc.is_file() else b"")
    h.update(_package_digest().encode())
    h.update(json.dumps(dict(OPTIONS, device=device), sort_keys=True).encode())
    return h.hexdigest()


def missing_glyphs(nb: dict) -> list[str]:
    """matplotlib's "Glyph ... missing from font" warnings in ``nb``'s outputs: labels drawn as empty boxes
    (a Chinese figure without the CJK font its folder's ``matplotlibrc`` names), one line each."""
    lines = (ln for c in nb.get("cells", []) for o in c.get("outputs", []) if o.get("output_type") == "stream"
             for ln in "".join(o.get("text", "")).splitlines())
    return sorted({ln.strip() for ln in lines if "missing from font" in ln})


def _stored_key(out: Path) -> str | None:
    try:
        return load_json(out)["metadata"]["tinytf"]["execution_key"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def execute(nb: Path, device: str = "cpu", *, root: Path = EXECUTED, force: bool = False) -> Path:
    """Execute ``nb`` with papermill into :func:`executed_path` (``-p device``; inline backend, so each
    figure is an ``image/png`` output; ``TINYTF_HEADLESS=1``: widgets as static figures; one thread).

    Reused without running when the copy is newer than ``nb`` and its stored :func:`execution_key`
    matches (same notebook, same ``tinytf`` files, same options); ``force`` runs it anyway. Raises
    RuntimeError when a cell fails (the partial run is kept as ``<name>.failed.ipynb``, no copy is left
    to be reused). Returns the copy's path.
    """
    nb = Path(nb).resolve()
    out, key = executed_path(nb, root), execution_key(nb, device)
    if not force and out.exists() and out.stat().st_mtime >= nb.stat().st_mtime and _stored_key(out) == key:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(f".{out.stem}.running.ipynb")
    from .kernels import zygote_for_this_process

    zygote_for_this_process()  # papermill_run.py forks the kernel from it (TINYTF_KERNEL_ZYGOTE)
    env = dict(os.environ, TINYTF_HEADLESS=OPTIONS["headless"], TINYTF_DEVICE=device, MPLBACKEND=INLINE,
               OMP_NUM_THREADS=OPTIONS["threads"])
    cmd = [sys.executable, _PAPERMILL, str(nb), str(part), str(nb.parent), device, OPTIONS["kernel"], "600"]
    start = time.perf_counter()
    run = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    noise = ("without encryption", "Use IPC transport")  # ipykernel's TCP note: nothing for a reader
    sys.stderr.write("".join(ln for ln in run.stderr.splitlines(keepends=True) if not any(n in ln for n in noise)))
    if run.returncode:
        failed = out.with_name(f"{out.stem}.failed.ipynb")
        if part.exists():
            part.replace(failed)
        out.unlink(missing_ok=True)  # neither a failed run nor an older copy may pass for this one
        raise RuntimeError(f"executing {_rel(nb)} failed (papermill exit {run.returncode}); the partial copy is {_rel(failed)}")
    done = load_json(part)
    if os.environ.get("TINYTF_REQUIRE_CJK_FONT") == "1" and (boxes := missing_glyphs(done)):
        part.replace(out.with_name(f"{out.stem}.failed.ipynb"))
        out.unlink(missing_ok=True)
        raise RuntimeError(f"{_rel(nb)} drew text its font lacks (TINYTF_REQUIRE_CJK_FONT=1): {boxes[0]} - put a "
                           "matplotlibrc naming a CJK font in its folder (notebooks/zh/matplotlibrc) and install one")
    done["metadata"]["tinytf"] = {"execution_key": key, "device": device}
    write_atomic(out, json.dumps(done, ensure_ascii=False, indent=1) + "\n")
    part.unlink()
    print(f"executed {_rel(nb)} -> {_rel(out)} in {time.perf_counter() - start:.0f} s", flush=True)
    return out


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


def execute_all(notebooks: Iterable[Path], device: str = "cpu", jobs: int = 2) -> list[Path]:
    """:func:`execute` each notebook, ``jobs`` at a time (every one is tried); the copies, in order.
    RuntimeError naming every notebook that failed."""
    notebooks = list(notebooks)

    def one(nb: Path) -> Path | Exception:
        try:
            return execute(nb, device)
        except RuntimeError as err:
            return err

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, notebooks))
    failed = [str(r) for r in results if isinstance(r, Exception)]
    if failed:
        raise RuntimeError("\n".join(failed))
    return results  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    """``python -m tinytf.course.executed [--jobs N] [--device D] NOTEBOOK ...`` (``make notebooks``): execute
    each notebook once into ``build/executed/`` (up-to-date copies reused); exit 1 naming every one that failed."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tinytf.course.executed", description=main.__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="notebooks executed in parallel")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("notebooks", nargs="+", type=Path)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        copies = execute_all(args.notebooks, args.device, args.jobs)
    except RuntimeError as err:
        print(err, file=sys.stderr)
        return 1
    print(f"{len(copies)} notebooks executed without an error, copies in {_rel(EXECUTED)}/ ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
