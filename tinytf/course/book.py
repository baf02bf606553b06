"""``make book``: the executed chapters as two static sites, one per language, that work offline.

1. Every chapter is executed with papermill into ``build/executed/`` by :func:`tinytf.course.executed.execute`
   (the inline backend, so every figure is a PNG output; widgets as their static figures), reused when
   newer than its source and executed from the same notebook, ``tinytf`` package and options.
2. Each language's pages are assembled in ``build/book-src/<lang>/``: a landing page (what the course
   is, the two commands, the chapter map), the executed chapters, the *released* exercises (what to do,
   never how: solutions and hidden tests stay out), the pitfall catalog and the README's section for
   instructors. The Chinese source also gets a jieba dictionary made from the glossary.
3. Sphinx + MyST-NB (``book/conf.py``: execution off, MathJax from the site) writes one book per
   language, ``build/book/en/`` and ``build/book/zh/`` (own sidebar, own search index, the Chinese one
   segmented by jieba), and ``build/book/index.html`` links to both.

``python -m tinytf.course.book [--jobs N] [--out DIR]`` builds the books;
``python -m tinytf.course.book --execute-only [--jobs N] [NOTEBOOK ...]`` only executes (every chapter of
both editions unless notebooks are named).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .executed import EXECUTED, execute, execute_all
from .nbgrader_root import REPO
from .notebook import cell_source, load_json

__all__ = ["Edition", "EDITIONS", "EXECUTED", "execute", "chapter_sources", "book_page", "glossary_terms", "assemble", "build",
           "main"]

HIDDEN_TAG = "remove-cell"  # MyST-NB: the cell is not on the page (papermill's injected parameters)


@dataclass(frozen=True)
class Edition:
    """Where one language's pages come from, and the words its landing page uses."""

    lang: str  # the book's folder: build/book/<lang>/
    sphinx_language: str
    notebooks: Path
    exercises: Path
    readme: Path
    instructors: str  # the README heading of the instructors' section
    words: dict[str, str]


EDITIONS = (
    Edition("en", "en", REPO / "notebooks", REPO / "exercises", REPO / "README.md", "## For instructors",
            {"commands": "Two commands", "chapters": "Chapters", "exercises": "Exercises", "more": "Reference",
             "pitfalls": "The pitfall catalog", "instructors": "For instructors", "live": "Read here; run in JupyterLab: "
             "every figure on these pages was made by the code above it (`make run`), and the widgets appear as their static "
             "figures — the live controls are in JupyterLab (`make lab`).",
             "pitfalls_intro": "Every classic mistake the course names, as `tinytf.checks` and `tinytf validate` name it "
             "(the table is generated from `tinytf.checks.catalog`).", "book": "English"}),
    Edition("zh", "zh_CN", REPO / "notebooks" / "zh", REPO / "exercises" / "zh", REPO / "README.zh.md", "## 给教师",
            {"commands": "两条命令", "chapters": "章节", "exercises": "练习", "more": "参考",
             "pitfalls": "陷阱目录", "instructors": "给教师",
             "live": "在这里阅读，在 JupyterLab 里运行：这些页面上的每一张图都由它上方的代码生成"
             "（`make run`），交互控件在这里显示为静态图——可交互的版本在 JupyterLab 里（`make lab`）。",
             "pitfalls_intro": "课程中点名的每一个经典错误，名称与 `tinytf.checks`、`tinytf validate` 所用的一致"
             "（表格由 `tinytf.checks.catalog` 生成）。", "book": "中文"}),
)
_LINK = re.compile(r"\[([^\]]+)\]\((?!https?://|#)[^)]*\)")  # a link to a repository file: its text only
GLOSSARY = REPO / "notebooks" / "zh" / "术语表.md"


def chapter_sources() -> list[Path]:
    """Every chapter of both editions, in book order."""
    return [p for ed in EDITIONS for p in sorted(ed.notebooks.glob("[0-9][0-9]_*.ipynb"))]


# -- assembly ----------------------------------------------------------------------------------------------

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
    lines += ["```{toctree}", ":hidden:", ":maxdepth: 1", "", *toc, "```", ""]
    return "\n".join(lines)


def book_page(executed: Path) -> dict:
    """An executed chapter as the book shows it: papermill's injected-parameters cell tagged
    ``remove-cell`` (the chapter's own parameters cell stays)."""
    nb = load_json(executed)
    for cell in nb["cells"]:
        tags = cell.setdefault("metadata", {}).setdefault("tags", [])
        if "injected-parameters" in tags and HIDDEN_TAG not in tags:
            tags.append(HIDDEN_TAG)
    return nb


def glossary_terms(path: Path = GLOSSARY) -> list[str]:
    """The Chinese terms of the glossary's first column (``掩码``, ``因果掩码``, ``KV`` + ``缓存`` ...), split at
    `` / `` and brackets, for jieba: "因果掩码" is one word of the search index, not only 因果 + 掩码."""
    terms: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or not cells[0] or set(cells[0]) <= set("-: ") or cells[0] == "中文":
            continue
        for part in re.split(r"\s*/\s*|[（）()、，\s]+", cells[0]):
            if re.search(r"[\u4e00-\u9fff]", part) and part not in terms:
                terms.append(part)
    return terms


def _write_edition(ed: Edition, root: Path, chapters: list[Path]) -> list[Path]:
    from tinytf.checks.catalog import glance_table

    (root / "_static").mkdir(parents=True)
    shutil.copyfile(REPO / "book" / "conf.py", root / "conf.py")
    shutil.copyfile(REPO / "book" / "tinytf.css", root / "_static" / "tinytf.css")
    shutil.copyfile(REPO / "book" / "tinytf-search-zh.js", root / "_static" / "tinytf-search-zh.js")
    shutil.copytree(REPO / "book" / "_templates", root / "_templates")
    exercises = sorted(ed.exercises.glob("ex[0-9][0-9]_*.ipynb"))
    pages = []
    for folder, files in (("chapters", chapters), ("exercises", exercises)):
        (root / folder).mkdir(parents=True, exist_ok=True)
        for f in files:
            text = json.dumps(book_page(f), ensure_ascii=False, indent=1) if folder == "chapters" else f.read_text(encoding="utf-8")
            (root / folder / f.name).write_text(text, encoding="utf-8")
            pages.append(root / folder / f.name)
    readme = ed.readme.read_text(encoding="utf-8")
    texts = {"index.md": _landing(ed, chapters, exercises),
             "pitfalls.md": f"# {ed.words['pitfalls']}\n\n{ed.words['pitfalls_intro']}\n\n{glance_table(ed.lang, chapter=None)}\n",
             "instructors.md": _section(readme, ed.instructors).replace(ed.instructors, "# " + ed.words["instructors"], 1)}
    for name, text in texts.items():
        (root / name).write_text(text, encoding="utf-8")
        pages.append(root / name)
    if ed.lang == "zh":  # book/conf.py hands it to Sphinx's Chinese search (html_search_options["dict"])
        (root / "_jieba_terms.txt").write_text("".join(f"{t} 2000\n" for t in glossary_terms()), encoding="utf-8")
    return pages


def assemble(src: Path, device: str = "cpu", jobs: int = 2) -> list[Path]:
    """Execute what needs it, then write every page's source into ``src/<lang>/`` (emptied first); the pages."""
    sources = chapter_sources()
    executed = dict(zip(sources, execute_all(sources, device, jobs)))
    shutil.rmtree(src, ignore_errors=True)
    pages = []
    for ed in EDITIONS:
        mine = [executed[p] for p in sources if p.parent == ed.notebooks]
        pages += _write_edition(ed, src / ed.lang, mine)
    return pages


_CHOOSER = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tinytf</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{{font-family:sans-serif;max-width:36rem;margin:4rem auto;padding:0 1rem}}
a{{display:block;font-size:1.3rem;margin:1rem 0}}</style>
</head><body><h1>tinytf</h1>
{links}
</body></html>
"""


def build(out: Path = REPO / "build" / "book", src: Path = REPO / "build" / "book-src", device: str = "cpu", jobs: int = 2) -> int:
    """Assemble the pages and run Sphinx once per language (``jobs`` at a time); the number of pages written."""
    import importlib.util

    if importlib.util.find_spec("jieba") is None:  # Sphinx would quietly index the Chinese book without Chinese words
        raise RuntimeError("the Chinese book's search needs jieba to split words: pip install jieba (in the dev extra)")
    pages = assemble(src, device, jobs)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)

    def sphinx(ed: Edition) -> None:  # one process per language: the MathJax extension is not parallel-safe
        # built beside the sources, then moved: MyST-NB writes its jupyter_execute/ next to the output folder,
        # and the doctrees are nothing to publish
        work = src / "_build" / ed.lang
        cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-D", f"language={ed.sphinx_language}",
               "-d", str(work / "doctrees"), str(src / ed.lang), str(work / "html")]
        subprocess.run(cmd, check=True, env=dict(os.environ, TINYTF_HEADLESS="1"))
        shutil.move(work / "html", out / ed.lang)

    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(EDITIONS)))) as pool:
        list(pool.map(sphinx, EDITIONS))
    links = "\n".join(f'<a href="{ed.lang}/index.html" hreflang="{ed.lang}">{_title_md(src / ed.lang / "index.md")} · '
                      f'{ed.words["book"]}</a>' for ed in EDITIONS)
    (out / "index.html").write_text(_CHOOSER.format(links=links), encoding="utf-8")
    (out / ".nojekyll").write_text("", encoding="utf-8")  # GitHub Pages: serve _static/ and _images/ as they are
    return len(pages)


def _title_md(md: Path) -> str:
    import html

    return html.escape(md.read_text(encoding="utf-8").splitlines()[0].lstrip("# ").strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tinytf.course.book", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "build" / "book"))
    parser.add_argument("--jobs", type=int, default=2, help="notebooks executed (and books built) in parallel")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--execute-only", action="store_true",
                        help="only execute into build/executed/ (reusing up-to-date copies); no book")
    parser.add_argument("notebooks", nargs="*", type=Path, help="with --execute-only: these notebooks (default: every chapter)")
    args = parser.parse_args(argv)
    if args.notebooks and not args.execute_only:
        parser.error("notebooks can only be named with --execute-only")
    if args.execute_only:
        try:
            copies = execute_all(args.notebooks or chapter_sources(), args.device, args.jobs)
        except RuntimeError as err:
            print(err, file=sys.stderr)
            return 1
        print(f"executed notebooks: {len(copies)} up to date in {EXECUTED.relative_to(REPO)}/")
        return 0
    n = build(Path(args.out), device=args.device, jobs=args.jobs)
    print(f"book: {n} pages in {args.out}/en/ and {args.out}/zh/ (open {args.out}/index.html, or serve the folder)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
