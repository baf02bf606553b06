"""``make book``: the executed chapters as a static site, in English and Chinese, that works offline.

1. Every chapter is executed with papermill into ``build/executed/`` (the copies ``make run`` makes;
   one newer than its source is reused).
2. The pages are assembled in ``build/book-src/``: a landing page per language (what the course is,
   the two commands, the chapter map), the executed chapters, the *released* exercises (what to do,
   never how: solutions and hidden tests stay out), the pitfall catalog and the README's section for
   instructors — English at the root, Chinese under ``zh/``.
3. Sphinx + MyST-NB (``book/conf.py``: execution off, MathJax from the site) writes ``build/book/``.

``python -m tinytf.course.book [--jobs N] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .nbgrader_root import REPO
from .notebook import cell_source, load_json

__all__ = ["Edition", "EDITIONS", "executed_copy", "assemble", "build", "main"]

EXECUTED = REPO / "build" / "executed"


@dataclass(frozen=True)
class Edition:
    """Where one language's pages come from, and the words its landing page uses."""

    lang: str
    prefix: str  # "" or "zh/": where its pages go in the site
    notebooks: Path
    exercises: Path
    readme: Path
    instructors: str  # the README heading of the instructors' section
    words: dict[str, str]


EDITIONS = (
    Edition("en", "", REPO / "notebooks", REPO / "exercises", REPO / "README.md", "## For instructors",
            {"commands": "Two commands", "chapters": "Chapters", "exercises": "Exercises", "more": "Reference",
             "pitfalls": "The pitfall catalog", "instructors": "For instructors", "live": "Read here; run in JupyterLab: "
             "every figure on these pages was made by the code above it (`make run`), and the widgets appear as their static "
             "figures — the live controls are in JupyterLab (`make lab`).",
             "pitfalls_intro": "Every classic mistake the course names, as `tinytf.checks` and `tinytf validate` name it "
             "(the table is generated from `tinytf.checks.catalog`)."}),
    Edition("zh", "zh/", REPO / "notebooks" / "zh", REPO / "exercises" / "zh", REPO / "README.zh.md", "## 给教师",
            {"commands": "两条命令", "chapters": "章节", "exercises": "练习", "more": "参考",
             "pitfalls": "陷阱目录", "instructors": "给教师",
             "live": "在这里阅读，在 JupyterLab 里运行：这些页面上的每一张图都由它上方的代码生成"
             "（`make run`），交互控件在这里显示为静态图——可交互的版本在 JupyterLab 里（`make lab`）。",
             "pitfalls_intro": "课程中点名的每一个经典错误，名称与 `tinytf.checks`、`tinytf validate` 所用的一致"
             "（表格由 `tinytf.checks.catalog` 生成）。"}),
)
_LINK = re.compile(r"\[([^\]]+)\]\((?!https?://|#)[^)]*\)")  # a link to a repository file: its text only


def executed_copy(nb: Path, device: str = "cpu") -> Path:
    """``build/executed/<path under notebooks/>``, executed with papermill unless newer than ``nb``."""
    out = EXECUTED / nb.relative_to(REPO / "notebooks")
    if out.exists() and out.stat().st_mtime >= nb.stat().st_mtime:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TINYTF_HEADLESS="1", TINYTF_DEVICE=device, MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "papermill", "--no-progress-bar", "--log-level", "WARNING", "-k", "python3",
           "--cwd", str(nb.parent), "-p", "device", device, str(nb), str(out)]
    run = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    noise = ("without encryption", "Use IPC transport")  # ipykernel's TCP note: nothing for a reader
    sys.stderr.write("".join(ln for ln in run.stderr.splitlines(keepends=True) if not any(n in ln for n in noise)))
    if run.returncode:
        out.unlink(missing_ok=True)  # a failed run's copy must not be reused as if it were good
        raise RuntimeError(f"executing {nb.relative_to(REPO)} failed (papermill exit {run.returncode}); the partial copy is {out}")
    print(f"executed {nb.relative_to(REPO)} -> {out.relative_to(REPO)}", flush=True)
    return out


def _title(nb_path: Path) -> str:
    for cell in load_json(nb_path)["cells"]:
        if cell.get("cell_type") == "markdown":
            for line in cell_source(cell).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return nb_path.stem


def _section(text: str, heading: str) -> str:
    """The README section under ``heading`` (to the next ``## ``), links to repository files unlinked."""
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return _LINK.sub(r"\1", text[start: end if end > 0 else None]).strip() + "\n"


def _intro(text: str) -> str:
    """The README's opening paragraphs (after the title, before the first ``## ``)."""
    body = text.split("\n", 1)[1].split("\n## ", 1)[0]
    return _LINK.sub(r"\1", "\n".join(ln for ln in body.splitlines() if not ln.startswith("[中文版") and "README" not in ln)).strip()


def _landing(ed: Edition, chapters: list[Path], exercises: list[Path]) -> str:
    w, readme = ed.words, ed.readme.read_text(encoding="utf-8")
    commands = readme.split("```bash", 1)[1].split("```", 1)[0].strip()
    lines = [f"# {readme.splitlines()[0].lstrip('# ').strip()}", "", _intro(readme), "", f"> {w['live']}", "",
             f"## {w['commands']}", "", "```bash", commands, "```", "", f"## {w['chapters']}", ""]
    lines += [f"- [{_title(p)}](chapters/{p.name})" for p in chapters]
    lines += ["", f"## {w['exercises']}", ""] + [f"- [{_title(p)}](exercises/{p.name})" for p in exercises]
    lines += ["", f"## {w['more']}", "", f"- [{w['pitfalls']}](pitfalls.md)", f"- [{w['instructors']}](instructors.md)", ""]
    toc = [f"chapters/{p.stem}" for p in chapters] + [f"exercises/{p.stem}" for p in exercises] + ["pitfalls", "instructors"]
    if ed.lang == "en":
        toc.append("zh/index")
    lines += ["```{toctree}", ":hidden:", ":maxdepth: 1", "", *toc, "```", ""]
    return "\n".join(lines)


def assemble(src: Path, device: str = "cpu", jobs: int = 2) -> list[Path]:
    """Write every page's source into ``src`` (emptied first); return the pages."""
    from tinytf.checks.catalog import glance_table

    shutil.rmtree(src, ignore_errors=True)
    (src / "_static").mkdir(parents=True)
    shutil.copyfile(REPO / "book" / "conf.py", src / "conf.py")
    shutil.copyfile(REPO / "book" / "tinytf.css", src / "_static" / "tinytf.css")
    sources = [(ed, p) for ed in EDITIONS for p in sorted(ed.notebooks.glob("[0-9][0-9]_*.ipynb"))]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        executed = list(pool.map(lambda item: executed_copy(item[1], device), sources))
    pages = []
    for ed in EDITIONS:
        root = src / ed.prefix
        chapters = [p for (e, _), p in zip(sources, executed) if e is ed]
        exercises = sorted(ed.exercises.glob("ex[0-9][0-9]_*.ipynb"))
        for folder, files in (("chapters", chapters), ("exercises", exercises)):
            (root / folder).mkdir(parents=True, exist_ok=True)
            for f in files:
                shutil.copyfile(f, root / folder / f.name)
                pages.append(root / folder / f.name)
        readme = ed.readme.read_text(encoding="utf-8")
        texts = {"index.md": _landing(ed, chapters, exercises),
                 "pitfalls.md": f"# {ed.words['pitfalls']}\n\n{ed.words['pitfalls_intro']}\n\n{glance_table(ed.lang)}\n",
                 "instructors.md": _section(readme, ed.instructors).replace(ed.instructors, "# " + ed.words["instructors"], 1)}
        for name, text in texts.items():
            (root / name).write_text(text, encoding="utf-8")
            pages.append(root / name)
    return pages


def build(out: Path = REPO / "build" / "book", src: Path = REPO / "build" / "book-src", device: str = "cpu", jobs: int = 2) -> int:
    """Assemble the pages and run Sphinx; the number of pages written."""
    pages = assemble(src, device, jobs)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", str(src), str(out)]  # serial: the MathJax extension is not parallel-safe
    subprocess.run(cmd, check=True, env=dict(os.environ, TINYTF_HEADLESS="1"))
    return len(pages)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tinytf.course.book", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "build" / "book"))
    parser.add_argument("--jobs", type=int, default=2, help="chapters executed (and pages read) in parallel")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    n = build(Path(args.out), device=args.device, jobs=args.jobs)
    print(f"book: {n} pages in {args.out}/ (open {args.out}/index.html, or serve the folder)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
