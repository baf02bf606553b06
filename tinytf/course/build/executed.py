"""Executed copies of notebooks in ``build/executed/`` (``make notebooks``, read by the book and the tests): run once,
reused while nothing they depend on changed.

:func:`execute_all` runs notebooks with papermill in stock kernels, ``jobs`` at a time in a
:class:`concurrent.futures.ProcessPoolExecutor` (spawned workers that import papermill once), the way the book needs
them (the inline backend, so each figure is an ``image/png`` output; ``TINYTF_HEADLESS=1``, so widgets are their
static figures; one thread). A copy is reused when it is newer than its source *and* its stored
:func:`execution_key` matches: a hash of the notebook, its folder's ``matplotlibrc``, the ``tinytf`` package's
files and these options, so a library change re-executes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import multiprocessing
import os
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from ..exercises import REPO
from ..ipynb import load_json, write_atomic

__all__ = ["EXECUTED", "OPTIONS", "executed_path", "execution_key", "missing_glyphs", "execute", "execute_all", "main"]

EXECUTED = REPO / "build" / "executed"
PACKAGE = REPO / "tinytf"
INLINE = "module://matplotlib_inline.backend_inline"  # figures become image/png outputs (Agg would leave "<Figure size ...>")
# what the executor does, in the key: changing it re-executes every copy
OPTIONS = {"backend": INLINE, "headless": "1", "kernel": "python3", "threads": "1", "version": 2}
_BUILDERS = ("build/executed.py", "build/book.py")  # this module and the book's: no chapter imports them; OPTIONS holds what they do to a run


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


def _fresh(nb: Path, out: Path, key: str) -> bool:
    return out.exists() and out.stat().st_mtime >= nb.stat().st_mtime and _stored_key(out) == key


def _worker_start(device: str) -> None:
    """A worker's start: the kernels' environment (inline figures, widgets as static figures, one thread), papermill."""
    from ..ipynb import skip_slow_imports

    os.environ.update(TINYTF_HEADLESS=OPTIONS["headless"], TINYTF_DEVICE=device, MPLBACKEND=INLINE, OMP_NUM_THREADS=OPTIONS["threads"])
    skip_slow_imports()
    import papermill  # noqa: F401 - once per worker

    logging.getLogger("papermill").setLevel(logging.WARNING)


def _papermill(nb: Path, part: Path, device: str) -> tuple[str, float]:
    """In a worker: papermill ``nb`` into ``part`` with ``-p device`` in a fresh kernel; ``("" or the failing cell's
    error, seconds)``."""
    import papermill

    from ..ipynb import kernel_config

    start = time.perf_counter()
    try:
        papermill.execute_notebook(str(nb), str(part), parameters={"device": device}, kernel_name=OPTIONS["kernel"],
                                   cwd=str(nb.parent), progress_bar=False, execution_timeout=600, config=kernel_config())
    except papermill.PapermillExecutionError as err:
        return str(err), time.perf_counter() - start
    return "", time.perf_counter() - start


def _finish(nb: Path, out: Path, key: str, device: str, error: str, seconds: float) -> Path:
    """Store a run's copy with its key; RuntimeError (the partial run kept as ``<name>.failed.ipynb``) when it failed."""
    part, failed = out.with_name(f".{out.stem}.running.ipynb"), out.with_name(f"{out.stem}.failed.ipynb")
    done = load_json(part) if part.exists() and not error else None
    if done is not None and os.environ.get("TINYTF_REQUIRE_CJK_FONT") == "1" and (boxes := missing_glyphs(done)):
        error = (f"it drew text its font lacks (TINYTF_REQUIRE_CJK_FONT=1): {boxes[0]} - put a matplotlibrc naming a CJK "
                 "font in its folder (notebooks/zh/matplotlibrc) and install one")
    if error or done is None:
        if part.exists():
            part.replace(failed)
        out.unlink(missing_ok=True)  # neither a failed run nor an older copy may pass for this one
        raise RuntimeError(f"executing {_rel(nb)} failed; the partial copy is {_rel(failed)}\n{error}")
    done["metadata"]["tinytf"] = {"execution_key": key, "device": device}
    write_atomic(out, json.dumps(done, ensure_ascii=False, indent=1) + "\n")
    part.unlink()
    print(f"executed {_rel(nb)} -> {_rel(out)} in {seconds:.0f} s", flush=True)
    return out


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


def execute_all(notebooks: Iterable[Path], device: str = "cpu", jobs: int = 2, *, root: Path = EXECUTED,
                force: bool = False) -> list[Path]:
    """Execute each notebook with papermill into :func:`executed_path` (``-p device``; the inline backend, so each
    figure is an ``image/png`` output; ``TINYTF_HEADLESS=1``: widgets as static figures; one thread), ``jobs`` at a time.

    A copy is reused without running when it is newer than its notebook and its stored :func:`execution_key`
    matches (same notebook, same ``tinytf`` files, same options); ``force`` runs it anyway. Every notebook is
    tried; RuntimeError names every one that failed (its partial run kept as ``<name>.failed.ipynb``, no copy left
    to be reused). Returns the copies' paths, in order.
    """
    notebooks = [Path(nb).resolve() for nb in notebooks]
    outs = [executed_path(nb, root) for nb in notebooks]
    keys = [execution_key(nb, device) for nb in notebooks]
    todo = [i for i, (nb, out, key) in enumerate(zip(notebooks, outs, keys)) if force or not _fresh(nb, out, key)]
    failed: list[str] = []
    if todo:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(todo))), mp_context=context, initializer=_worker_start,
                                 initargs=(device,)) as pool:
            runs = {}
            for i in todo:
                outs[i].parent.mkdir(parents=True, exist_ok=True)
                runs[i] = pool.submit(_papermill, notebooks[i], outs[i].with_name(f".{outs[i].stem}.running.ipynb"), device)
            for i, fut in runs.items():
                try:
                    _finish(notebooks[i], outs[i], keys[i], device, *fut.result())
                except RuntimeError as err:
                    failed.append(str(err))
    if failed:
        raise RuntimeError("\n".join(failed))
    return outs


def execute(nb: Path, device: str = "cpu", *, root: Path = EXECUTED, force: bool = False) -> Path:
    """:func:`execute_all` of one notebook: its executed copy (reused when up to date)."""
    return execute_all([nb], device, 1, root=root, force=force)[0]


def main(argv: list[str] | None = None) -> int:
    """``python -m tinytf.course.build.executed [--jobs N] [--device D] NOTEBOOK ...`` (``make notebooks``): execute
    each notebook once into ``build/executed/`` (up-to-date copies reused); exit 1 naming every one that failed."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tinytf.course.build.executed", description=main.__doc__.splitlines()[0])
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
