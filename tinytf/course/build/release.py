"""``tinytf release``: the student notebooks in ``exercises/`` from the instructor ones in ``solutions/``.

nbgrader's ``generate_assignment`` does the work (solution regions -> ``raise NotImplementedError()``,
hidden tests removed, cells locked, checksums) inside a temporary course root with one assignment
per exercise (see :mod:`tinytf.course.build.nbgrader_root`). The result is written with sorted keys,
stable cell ids and a final newline, so releasing twice gives byte-identical files.

Every release is remembered: ``releases.json`` next to the released notebooks (``exercises/`` and
``exercises/zh/``) holds, per exercise and test cell, the checksum of every version of that test
ever released (:func:`test_checksum`; never removed, only added). ``tinytf validate`` and ``tinytf
grade`` accept a test cell that matches any of them — a student who started on an earlier release
has not tampered with anything — and run today's version. :func:`record_history` seeds the manifest
from every committed version in git.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ..exercises import EDITION_FOLDERS, REPO, find_notebooks
from .nbgrader_root import SUPPORT_FILES, build_course_root
from ..ipynb import cell_source, dumps_notebook, is_test_cell, load_json, nbgrader_meta, write_atomic

__all__ = ["release", "release_editions", "released_text", "EDITION_FOLDERS", "MANIFEST", "SUPPORT_FILES", "test_checksum",
           "load_manifest", "record_release", "record_history", "earlier_release"]

MANIFEST = "releases.json"  # in each folder of released notebooks: {exNN: {grade_id: [checksum, ...]}}


def test_checksum(source: str) -> str:
    """The checksum of a test cell's source as released (surrounding whitespace ignored, as the comparisons do)."""
    return hashlib.sha256(source.strip().encode("utf-8")).hexdigest()[:16]


def load_manifest(folder: str | Path) -> dict[str, dict[str, list[str]]]:
    """``folder/releases.json`` ({} when there is none)."""
    path = Path(folder) / MANIFEST
    return load_json(path) if path.is_file() else {}


def earlier_release(manifest: dict, ex: str, grade_id: str, source: str) -> bool:
    """True when ``source`` is a version of test cell ``grade_id`` of ``ex`` that was released once."""
    return test_checksum(source) in manifest.get(ex, {}).get(grade_id, [])


def _add(manifest: dict, nb: dict, ex: str) -> None:
    for cell in nb.get("cells", []):
        gid = nbgrader_meta(cell).get("grade_id")
        if gid and is_test_cell(cell):
            known = manifest.setdefault(ex, {}).setdefault(str(gid), [])
            if test_checksum(cell_source(cell)) not in known:
                known.append(test_checksum(cell_source(cell)))


def _write_manifest(folder: Path, manifest: dict) -> None:
    text = json.dumps({ex: dict(sorted(cells.items())) for ex, cells in sorted(manifest.items())}, indent=1) + "\n"
    path = folder / MANIFEST
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        write_atomic(path, text)


def record_release(folder: str | Path, notebooks: Iterable[Path]) -> None:
    """Add the test cells of the released ``notebooks`` (``exNN_*.ipynb``) to ``folder/releases.json``."""
    folder = Path(folder)
    manifest = load_manifest(folder)
    for nb_path in notebooks:
        _add(manifest, load_json(nb_path), nb_path.name[:4])
    _write_manifest(folder, manifest)


def record_history(folder: str | Path, repo: str | Path = REPO) -> None:
    """Add every version of ``folder/exNN_*.ipynb`` ever committed to git (``repo``'s history) to the manifest."""
    folder, repo = Path(folder).resolve(), Path(repo).resolve()
    rel = folder.relative_to(repo).as_posix()
    manifest = load_manifest(folder)
    commits = subprocess.run(["git", "-C", str(repo), "rev-list", "HEAD", "--", rel], capture_output=True, text=True,
                             check=True).stdout.split()
    for commit in commits:
        names = subprocess.run(["git", "-C", str(repo), "ls-tree", "--name-only", f"{commit}:{rel}"], capture_output=True,
                               text=True, check=True).stdout.split()
        for name in names:
            if re.fullmatch(r"ex\d\d\w*\.ipynb", name):
                text = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{rel}/{name}"], capture_output=True,
                                      text=True, check=True).stdout
                _add(manifest, json.loads(text), name[:4])
    _write_manifest(folder, manifest)



def released_text(root: Path, ex: str, name: str) -> str:
    """The deterministic text of ``root/release/<ex>/<name>``."""
    return dumps_notebook(load_json(root / "release" / ex / name))


def release(
    solutions: str | Path = REPO / "solutions",
    out: str | Path = REPO / "exercises",
    exercises: Iterable[str] | None = None,
    *,
    prune: bool | None = None,
) -> list[Path]:
    """Generate the student version of each ``solutions/exNN_*.ipynb`` into ``out``; return the paths.

    ``exercises`` limits it to some ids (``["ex01"]``). ``prune`` (default: when releasing all)
    removes ``out/exNN_*.ipynb`` files that no longer have a solution. Files whose content is
    unchanged are not rewritten.
    """
    sols = find_notebooks(solutions, exercises)
    if not sols:
        raise FileNotFoundError(f"no exNN_*.ipynb notebooks in {solutions}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="tinytf-release-"))
    try:
        root, names = build_course_root(sols, tmp / "course")
        written = []
        for ex, name in sorted(names.items()):
            text = released_text(root, ex, name)
            dest = out / name
            if not dest.exists() or dest.read_text(encoding="utf-8") != text:
                write_atomic(dest, text)
            written.append(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for name in SUPPORT_FILES:  # the folder's settings travel with its notebooks (the CJK font of zh figures)
        src, dest = Path(solutions) / name, out / name
        if src.is_file() and (not dest.is_file() or dest.read_bytes() != src.read_bytes()):
            shutil.copyfile(src, dest)
    record_release(out, written)
    if prune if prune is not None else exercises is None:
        keep = {p.name for p in written}
        for stale in out.glob("ex[0-9][0-9]*.ipynb"):
            if stale.name not in keep:
                stale.unlink()
    return written


def release_editions(repo: str | Path = REPO, exercises: Iterable[str] | None = None) -> list[Path]:
    """:func:`release` for every edition whose ``solutions`` folder exists: ``solutions/`` ->
    ``exercises/`` and ``solutions/zh/`` -> ``exercises/zh/``. Each edition is released on its own
    (nbgrader's checksums cover the comments, which the Chinese twins translate)."""
    repo = Path(repo)
    written: list[Path] = []
    for src, out in EDITION_FOLDERS.values():
        if find_notebooks(repo / src):
            written += release(repo / src, repo / out, exercises)
    return written
