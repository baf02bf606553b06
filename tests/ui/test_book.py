"""The books (``make test-book``): every page of ``build/book/`` (``en/``, ``zh/`` and the chooser at the
root) opened in Debian's Chromium, several pages at once, with every request outside the site blocked and
recorded.

Asserts, per page: no blocked or failed request, no console error, every image loaded, every internal
link resolves, a link to the twin page in the other book, a sidebar that lists only its own book's pages,
no ``<Figure size ...>`` text; per chapter: as many images as its executed notebook has figure outputs,
and at least as many as the figures its source draws (:func:`figures_drawn`); the maths is rendered
(MathJax from the site); the language switch leads to the twin; searching each book (typed into its search
box) finds the chapters whose headings name the term (掩码, 因果掩码, KV 缓存 in Chinese). Never the
solutions: no line of a solution region and no hidden test reaches the site. Screenshots of the landings
and of chapters 01, 05 and 10 in both languages land in ``build/book-shots/``.

Waits are for events (load, MathJax's startup promise, fonts, no request in flight), never fixed times.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import http.server
import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import pytest

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "build" / "book"
SRC = ROOT / "build" / "book-src"
SHOTS = ROOT / "build" / "book-shots"
LANGS = {"en": ROOT / "notebooks", "zh": ROOT / "notebooks" / "zh"}
sys.path.insert(0, str(ROOT / "tests"))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")  # Debian's, never a downloaded one
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
PARALLEL = int(os.environ.get("TINYTF_BOOK_PAGES", "4"))  # pages open at once
LIMIT_MS = 180_000  # the most any one wait may take (a busy 2-core machine); each wait ends on its event, not on a timer
SHOTS_OF = {f"{lang}/{page}" for lang in LANGS for page in
            ("index.html", "chapters/01_attention.html", "chapters/05_complexity.html", "chapters/10_tiled_attention.html")}
SEARCHES = {"en": ("mask", "causal mask", "KV cache"), "zh": ("掩码", "因果掩码", "KV 缓存")}
PYPLOT_MAKERS = {"figure", "subplots", "subplot_mosaic"}


# -- what the sources say the pages must show ---------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _viz_makers() -> frozenset[str]:
    """The public ``tinytf.viz`` functions that draw a figure (figures and widgets; not the updaters)."""
    import tinytf.viz

    return frozenset(n for n in tinytf.viz.__all__ if not n.startswith(("update_", "is_")))


def _calls_outside_defs(tree: ast.AST):
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                stack.append(child)
        if isinstance(node, ast.Call):
            yield node.func


def figures_drawn(nb_path: Path) -> int:
    """A lower bound of the figures a notebook draws, read from its source: in each code cell, every call
    written outside a ``def`` to ``plt.figure``/``plt.subplots``/``plt.subplot_mosaic`` or to a
    ``tinytf.viz`` figure or widget function (``attention_explorer(...)``, ``memory_figure(...)`` ...),
    each counted once (a call in a loop may draw more)."""
    n = 0
    for cell in json.loads(nb_path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        tree = ast.parse("\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))))
        for func in _calls_outside_defs(tree):
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "plt":
                n += func.attr in PYPLOT_MAKERS
            elif isinstance(func, ast.Name | ast.Attribute):
                n += (func.id if isinstance(func, ast.Name) else func.attr) in _viz_makers()
    return n


def figure_outputs(nb_path: Path) -> int:
    """The ``image/png`` outputs of an executed notebook (the book's copy)."""
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    return sum("image/png" in out.get("data", {}) for cell in nb["cells"] for out in cell.get("outputs", []))


def _injected(nb_path: Path) -> bool:
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    return any("injected-parameters" in c.get("metadata", {}).get("tags", []) for c in nb["cells"])


def _chapters(lang: str) -> list[Path]:
    return sorted(LANGS[lang].glob("[0-9][0-9]_*.ipynb"))


def _headings(nb_path: Path) -> str:
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    return "\n".join(ln for c in nb["cells"] if c["cell_type"] == "markdown" for ln in "".join(c["source"]).splitlines()
                     if ln.startswith("#"))


def _pages() -> list[str]:
    return sorted(p.relative_to(SITE).as_posix() for p in SITE.rglob("*.html")
                  if not any(part.startswith("_") for part in p.relative_to(SITE).parts))


# -- the browser ---------------------------------------------------------------------------------------------

class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no line per request
        pass


@pytest.fixture(scope="module")
def site():
    if not all((SITE / lang / "index.html").is_file() for lang in LANGS):
        pytest.fail("no build/book/en/index.html and build/book/zh/index.html: run `make book` first")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(SITE)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


async def _browser(pw):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: install it (Debian: apt-get install chromium)")
    return await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)


class _Watch:
    """A page's problems (outside requests, failures, console errors) and the requests still in flight."""

    def __init__(self, page, site: str) -> None:
        self.site, self.problems, self.inflight = site, [], set()
        self.idle = asyncio.Event()
        self.idle.set()
        page.on("request", self._start)
        for event in ("requestfinished", "requestfailed"):
            page.on(event, self._end)
        page.on("requestfailed", lambda r: self.problems.append(f"failed request {r.url}") if r.url.startswith(site) else None)
        page.on("response", lambda r: self.problems.append(f"HTTP {r.status} for {r.url}") if r.status >= 400 else None)
        page.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))

    def _start(self, request) -> None:
        self.inflight.add(request)
        self.idle.clear()

    def _end(self, request) -> None:
        self.inflight.discard(request)
        if not self.inflight:
            self.idle.set()

    async def settled(self, page) -> None:
        """No request in flight, after the document, MathJax's typesetting and the fonts are done."""
        await page.evaluate("""async () => {
            if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
            await document.fonts.ready;
            await Promise.all(Array.from(document.images).map(i => i.complete ? null : new Promise(ok => {
                i.addEventListener('load', ok); i.addEventListener('error', ok); })));
        }""")
        await asyncio.wait_for(self.idle.wait(), LIMIT_MS / 1000)


async def _route(context, site: str, blocked: list[str]) -> None:
    async def route(r):
        if r.request.url.startswith(site) or r.request.url.startswith(("data:", "blob:")):
            await r.continue_()
        else:
            blocked.append(r.request.url)
            await r.abort()

    await context.route("**/*", route)


_FACTS = """() => ({
    images: Array.from(document.images).map(i => ({src: i.getAttribute('src'), ok: i.complete && i.naturalWidth > 0,
                                                   output: !!i.closest('.cell_output')})),
    figureText: document.body.innerText.includes('<Figure size'),
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
    sidebar: Array.from(document.querySelectorAll('.bd-sidebar-primary a[href]')).map(a => a.href),
    twin: (document.querySelector('a.tinytf-twin') || {}).href || null,
    maths: document.querySelectorAll('mjx-container').length,
    mathSources: document.querySelectorAll('.math').length,
    injectedCells: Array.from(document.querySelectorAll('.cell')).filter(c => /^\\s*# Parameters\\s*$/m.test(c.innerText)).length,
})"""


async def _visit(context, site: str, rel: str, gate: asyncio.Semaphore) -> dict:
    async with gate:
        page = await context.new_page()
        watch = _Watch(page, site)
        try:
            await page.goto(f"{site}/{quote(rel)}", wait_until="load")
            await watch.settled(page)
            facts = await page.evaluate(_FACTS)
            if rel in SHOTS_OF:
                SHOTS.mkdir(parents=True, exist_ok=True)
                await page.screenshot(path=str(SHOTS / (rel.replace("/", "_").replace(".html", ".png"))), full_page=True)
        finally:
            await page.close()
    facts["problems"] = watch.problems
    return facts


async def _crawl(site: str, pages: list[str]) -> tuple[dict[str, dict], list[str], float]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await _browser(pw)
        context = await browser.new_context(viewport={"width": 1300, "height": 900})
        blocked: list[str] = []
        context.set_default_timeout(LIMIT_MS)
        await _route(context, site, blocked)
        gate = asyncio.Semaphore(PARALLEL)
        start = time.perf_counter()
        facts = await asyncio.gather(*(_visit(context, site, rel, gate) for rel in pages))
        seconds = time.perf_counter() - start
        await browser.close()
    return dict(zip(pages, facts)), blocked, seconds


@pytest.fixture(scope="module")
def crawl(site):
    pages = _pages()
    facts, blocked, seconds = asyncio.run(_crawl(site, pages))
    print(f"\nbook crawl: {len(pages)} pages in {seconds:.1f} s, {PARALLEL} at a time")
    return {"site": site, "pages": facts, "blocked": blocked}


def _target(site: str, href: str) -> Path:
    path = unquote(urlsplit(href).path)
    target = SITE / path.lstrip("/")
    return target / "index.html" if path.endswith("/") or target.is_dir() else target


# -- the tests -----------------------------------------------------------------------------------------------

def test_every_page_loads_offline_with_its_images_links_and_twin(crawl):
    site, pages = crawl["site"], crawl["pages"]
    per_book = {lang: [r for r in pages if r.startswith(f"{lang}/")] for lang in LANGS}
    expected = {lang: len(_chapters(lang)) + len(list((ROOT / "exercises" / ("" if lang == "en" else "zh")).glob("ex*.ipynb")))
                + 5 for lang in LANGS}  # + landing, pitfalls, instructors, genindex, search
    assert {lang: len(v) for lang, v in per_book.items()} == expected, "the pages of each book"
    assert "index.html" in pages, "the chooser at the site's root"
    bad = [f"blocked request to {u}" for u in crawl["blocked"]]
    for rel, info in pages.items():
        bad += [f"{rel}: {p}" for p in info["problems"]]
        bad += [f"{rel}: image did not load: {i['src']}" for i in info["images"] if not i["ok"]]
        bad += [f"{rel}: link to missing {h}" for h in info["links"] if h.startswith(site) and not _target(site, h).is_file()]
        if info["figureText"]:
            bad.append(f"{rel}: shows '<Figure size ...>' text where a figure belongs")
        if rel == "index.html":
            continue
        lang = rel.split("/", 1)[0]
        bad += [f"{rel}: the sidebar links to {h}, outside the {lang} book" for h in info["sidebar"]
                if h.startswith(site) and not urlsplit(h).path.startswith(f"/{lang}/")]
        if not info["twin"]:
            bad.append(f"{rel}: no link to the page in the other language")
        elif not _target(site, info["twin"]).is_file() or urlsplit(info["twin"]).path.split("/")[1] == lang:
            bad.append(f"{rel}: the language switch leads to {info['twin']}, not to the twin in the other book")
    assert not bad, "\n".join(bad[:40])


def test_each_book_has_its_own_sidebar_and_search_index(crawl):
    for lang in LANGS:
        sidebar = {urlsplit(h).path for h in crawl["pages"][f"{lang}/index.html"]["sidebar"]}
        chapters = {f"/{lang}/chapters/{p.stem}.html" for p in _chapters(lang)}
        assert chapters <= sidebar, f"the {lang} sidebar lists its chapters"
        pages = {rel.removeprefix(f"{lang}/").removesuffix(".html") for rel in crawl["pages"] if rel.startswith(f"{lang}/")}
        assert set(_search_index(lang)["docnames"]) == pages - {"genindex", "search"}, f"the {lang} index: its own pages"
    words = {lang: set(_search_index(lang)["terms"]) | set(_search_index(lang)["titleterms"]) for lang in LANGS}
    assert {"掩码", "因果掩码", "缓存"} <= words["zh"], "the Chinese index holds Chinese words (jieba, the glossary)"
    assert "掩码" not in words["en"] and {"mask", "cach"} <= words["en"]


def _search_index(lang: str) -> dict:
    text = (SITE / lang / "searchindex.js").read_text(encoding="utf-8")
    return json.loads(text[text.index("(") + 1: text.rindex(")")])


@pytest.mark.parametrize("lang", sorted(LANGS))
def test_every_chapter_page_shows_its_figures(crawl, lang):
    chapters = _chapters(lang)
    assert len(chapters) >= 11, f"{len(chapters)} {lang} chapters"
    counts, bad = {}, []
    for nb in chapters:
        rel = f"{lang}/chapters/{nb.stem}.html"
        info = crawl["pages"][rel]
        shown = sum(i["output"] for i in info["images"])
        outputs, drawn = figure_outputs(SRC / lang / "chapters" / nb.name), figures_drawn(nb)
        counts[nb.stem] = (shown, outputs, drawn)
        if shown != outputs:
            bad.append(f"{rel}: {shown} images in cell outputs, but its executed notebook has {outputs} figure outputs")
        if outputs < drawn:
            bad.append(f"{rel}: {outputs} figure outputs, but its source draws at least {drawn} figures")
        if not _injected(SRC / lang / "chapters" / nb.name):
            bad.append(f"{rel}: its executed copy has no papermill-injected parameters cell (was it executed with -p device?)")
        if info["injectedCells"]:
            bad.append(f"{rel}: shows papermill's injected '# Parameters' cell (a second parameters cell)")
    print(f"\n{lang} figures (page images, executed outputs, drawn by the source): {counts}")
    assert sum(d for _, _, d in counts.values()) >= len(chapters), "the rule finds figures to count"
    assert not bad, "\n".join(bad)


def test_the_maths_is_rendered(crawl):
    missing = [f"{rel}: {info['mathSources']} maths elements, {info['maths']} typeset" for rel, info in crawl["pages"].items()
               if info["maths"] < info["mathSources"]]
    assert not missing, "maths not typeset by MathJax (served from the site):\n" + "\n".join(missing)
    for lang in LANGS:
        with_maths = [rel for rel, info in crawl["pages"].items() if rel.startswith(f"{lang}/") and info["mathSources"]]
        assert with_maths, f"no page of the {lang} book has maths: the check tests nothing"


async def _switch_and_search(site: str) -> tuple[list[str], dict[tuple[str, str], list[str]]]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await _browser(pw)
        context = await browser.new_context(viewport={"width": 1300, "height": 900})
        blocked: list[str] = []
        context.set_default_timeout(LIMIT_MS)
        await _route(context, site, blocked)
        page = await context.new_page()
        urls = []
        await page.goto(f"{site}/en/chapters/01_attention.html")
        for _ in range(2):
            await page.locator("a.tinytf-twin").click()
            await page.wait_for_load_state("load")
            urls.append(urlsplit(page.url).path + " " + (await page.locator("h1").first.inner_text()))
        results = {}
        for lang, queries in SEARCHES.items():
            for query in queries:
                await page.goto(f"{site}/{lang}/index.html")
                await page.locator("button.search-button-field").first.click()
                box = page.locator("#pst-search-dialog input[name=q]")
                await box.fill(query)
                await box.press("Enter")
                await page.wait_for_url(re.compile(r"/search\.html\?q="))
                # searchtools.js writes the summary once, when the last result is listed (its "..." pulse can outlive it)
                await page.wait_for_function("() => { const s = document.querySelector('#search-results .search-summary'); "
                                             "return s && s.innerText.trim().length > 0; }")
                results[lang, query] = await page.evaluate(
                    "() => Array.from(document.querySelectorAll('#search-results ul.search li > a')).map(a => a.href)")
                results[lang, query, "summary"] = await page.locator("#search-results .search-summary").inner_text()
                if (lang, query) == ("zh", "掩码"):
                    SHOTS.mkdir(parents=True, exist_ok=True)
                    await page.screenshot(path=str(SHOTS / "search_zh.png"))
        await browser.close()
    assert not blocked, blocked
    return urls, results


@pytest.fixture(scope="module")
def switched_and_searched(site):
    return asyncio.run(_switch_and_search(site))


def test_the_language_switch_leads_to_the_twin(switched_and_searched):
    urls, _ = switched_and_searched
    assert urls[0].startswith("/zh/chapters/01_attention.html") and "注意力" in urls[0], urls
    assert urls[1].startswith("/en/chapters/01_attention.html") and "Attention" in urls[1], urls


@pytest.mark.parametrize("lang", sorted(LANGS))
def test_searching_the_book_finds_the_chapters_that_teach_the_term(switched_and_searched, site, lang):
    _, results = switched_and_searched
    report = []
    for query in SEARCHES[lang]:
        found = [urlsplit(h).path for h in results[lang, query]]
        teach = [f"/{lang}/chapters/{nb.stem}.html" for nb in _chapters(lang) if query.lower() in _headings(nb).lower()]
        assert teach, f"no {lang} chapter has {query!r} in a heading: the query tests nothing"
        report.append(f"{query}: {len(found)} pages ({results[lang, query, 'summary'].strip()}), first {found[:5]}")
        assert all(p.startswith(f"/{lang}/") for p in found), f"{query!r}: results outside the {lang} book: {found}"
        missing = [p for p in teach if p not in found]
        assert not missing, f"searching {query!r} in the {lang} book misses {missing} (found {found})"
        summary = results[lang, query, "summary"]
        n = len(found)
        said = {"en": f"found {n} pages" if n != 1 else "found one page", "zh": f"搜索完成，找到 {n} 个匹配的页面"}[lang]
        assert said in summary, f"{lang} search page's summary for {query!r}: {summary!r} (expected {said!r})"
    print(f"\n{lang} search:\n" + "\n".join(report))


def test_no_solution_or_hidden_test_reaches_the_book():
    """No solution line and no hidden-test token is on any page, unless the public sources (the chapters,
    the released exercises and the READMEs the instructors' page is made from) contain it themselves — e.g.
    ``causal_mask`` is taught in chapter 02, ``judged_record`` is named in the README's grading section."""
    import _coursekit as K

    # everything made from our pages; not _static/, which holds the theme's and MathJax's own files (30 MB a book)
    files = [p for p in SITE.rglob("*") if p.suffix in (".html", ".js", ".txt", ".ipynb") and "_static" not in p.parts]
    assert len(files) >= 2 * 26, f"only {len(files)} files in build/book"
    text = "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files)
    assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text
    public = "\n".join(K.src(c) for d in ("notebooks", "exercises") for nb in sorted((ROOT / d).rglob("*.ipynb"))
                       for c in json.loads(nb.read_text(encoding="utf-8"))["cells"])
    public += "\n".join((ROOT / name).read_text(encoding="utf-8") for name in ("README.md", "README.zh.md"))
    found, solutions = [], sorted((ROOT / "solutions").rglob("ex[0-9][0-9]_*.ipynb"))
    assert len(solutions) >= 20, f"{len(solutions)} solutions"
    site_words, public_words = _words(text), _words(public)
    for sol in solutions:
        nb = json.loads(sol.read_text(encoding="utf-8"))
        secret_lines = {line for line in K.solution_only_lines(nb) if line not in public}
        tokens = set(K.hidden_tokens(nb, feedback=True))
        secret_tokens = tokens - set(_leaks(public, public_words, tokens))
        found += [f"{sol.relative_to(ROOT)}: {line}" for line in sorted(secret_lines) if line in text]
        found += [f"{sol.relative_to(ROOT)}: hidden {t}" for t in _leaks(text, site_words, secret_tokens)]
    assert not found, "\n".join(found[:20])


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _words(text: str) -> set[str]:
    """Every maximal run of word characters: an identifier occurs as a whole word iff it is one of them."""
    return set(re.findall(r"[A-Za-z0-9_]+", text))


def _leaks(text: str, words: set[str], tokens: set[str]) -> list[str]:
    """``_coursekit.leaks`` (identifiers as whole words, other tokens as substrings), with the words of
    ``text`` found once instead of one regex scan of the whole site per identifier."""
    return sorted(t for t in tokens if (t in words if _IDENTIFIER.fullmatch(t) else t in text))
