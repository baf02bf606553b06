"""The book (``make test-book``): every page of ``build/book/`` opened in Debian's Chromium with every
request outside the site blocked and recorded.

Asserts, per page: no blocked or failed request, no console error, every image loaded, every internal
link resolves, and a link to the twin page in the other language; the maths of chapter 01 is rendered
(MathJax from the site); the language switch leads to the twin. Never the solutions: no line of a
solution region and no hidden test reaches the site. Screenshots of the landing page and chapter 01 in
both languages land in ``build/book-shots/``.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import sys
import threading
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "build" / "book"
SHOTS = ROOT / "build" / "book-shots"
sys.path.insert(0, str(ROOT / "tests"))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")  # Debian's, never a downloaded one
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def _pages() -> list[Path]:
    return sorted(p for p in SITE.rglob("*.html") if not p.relative_to(SITE).parts[0].startswith("_"))


@pytest.fixture(scope="module")
def site():
    if not (SITE / "index.html").is_file():
        pytest.fail("no build/book/index.html: run `make book` first")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(SITE))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: install it (Debian: apt-get install chromium)")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def _visit(browser, site: str, rel: str, shot: str | None = None) -> dict:
    """Open one page with outside requests blocked; what went wrong on it, and its internal links."""
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    problems: list[str] = []

    def route(r):
        if r.request.url.startswith(site) or r.request.url.startswith(("data:", "blob:")):
            r.continue_()
        else:
            problems.append(f"blocked request to {r.request.url}")
            r.abort()

    page.route("**/*", route)
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"failed request {r.url}") if r.url.startswith(site) else None)
    page.on("response", lambda r: problems.append(f"HTTP {r.status} for {r.url}") if r.status >= 400 else None)
    page.goto(f"{site}/{rel}", wait_until="load")
    page.wait_for_load_state("networkidle")
    broken = page.evaluate("""() => Array.from(document.images)
        .filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute('src'))""")
    problems += [f"image did not load: {src}" for src in broken]
    maths = page.locator(".math").count()
    if maths:  # MathJax typesets after the load event
        try:
            page.wait_for_selector("mjx-container", state="attached", timeout=20_000)
        except Exception:  # noqa: BLE001 - reported below as a problem of this page
            problems.append(f"{maths} maths elements but no MathJax output")
        page.wait_for_load_state("networkidle")  # the fonts it asked for
    hrefs = page.evaluate("() => Array.from(document.querySelectorAll('a[href]')).map(a => a.href)")
    info = {"problems": problems, "links": [h for h in hrefs if h.startswith(site)],
            "twin": page.evaluate("() => { const a = document.querySelector('a.tinytf-twin'); return a ? a.href : null; }"),
            "maths": page.locator("mjx-container").count(), "maths_sources": maths}
    if shot:
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / shot))
    page.close()
    return info


def _target(site: str, href: str) -> Path:
    path = unquote(urlsplit(href).path)
    target = SITE / path.lstrip("/")
    return target / "index.html" if path.endswith("/") or target.is_dir() else target


def test_every_page_loads_offline_with_its_images_links_and_twin(site, browser):
    pages = _pages()
    assert len(pages) >= 20, f"only {len(pages)} pages in build/book"
    shots = {"index.html": "landing_en.png", "zh/index.html": "landing_zh.png",
             "chapters/01_attention.html": "chapter01_en.png", "zh/chapters/01_attention.html": "chapter01_zh.png"}
    bad: list[str] = []
    with_maths = 0
    for page in pages:
        rel = page.relative_to(SITE).as_posix()
        info = _visit(browser, site, rel, shots.get(rel))
        bad += [f"{rel}: {p}" for p in info["problems"]]
        bad += [f"{rel}: link to missing {h}" for h in info["links"] if not _target(site, h).is_file()]
        if rel not in ("genindex.html", "search.html", "zh/genindex.html", "zh/search.html"):
            if not info["twin"]:
                bad.append(f"{rel}: no link to the page in the other language")
            elif not _target(site, info["twin"]).is_file():
                bad.append(f"{rel}: the language switch leads to a missing page {info['twin']}")
        with_maths += bool(info["maths"])
    assert not bad, "\n".join(bad[:40])
    assert with_maths >= 2, "no page shows rendered maths (MathJax served from the site)"


def test_the_language_switch_leads_to_the_twin(site, browser):
    page = browser.new_page()
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(site) else r.abort())
    page.goto(f"{site}/chapters/01_attention.html")
    page.locator("a.tinytf-twin").click()
    page.wait_for_url(re.compile(r"/zh/chapters/01_attention\.html$"))
    assert page.locator("h1", has_text="注意力").count(), "the Chinese twin of chapter 01"
    page.locator("a.tinytf-twin").click()
    page.wait_for_url(re.compile(r"/chapters/01_attention\.html$"))
    assert "/zh/" not in page.url
    page.close()


def test_no_solution_or_hidden_test_reaches_the_book():
    """No solution line and no hidden-test token is on any page, unless the public sources (the chapters
    and the released exercises) contain it themselves — e.g. ``causal_mask`` is taught in chapter 02."""
    import _coursekit as K

    files = [p for p in SITE.rglob("*") if p.suffix in (".html", ".js", ".txt", ".ipynb")]
    text = "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files)
    assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text
    public = "\n".join(K.src(c) for d in ("notebooks", "exercises") for nb in sorted((ROOT / d).rglob("*.ipynb"))
                       for c in json.loads(nb.read_text(encoding="utf-8"))["cells"])
    found = []
    for sol in sorted((ROOT / "solutions").rglob("ex[0-9][0-9]_*.ipynb")):
        nb = json.loads(sol.read_text(encoding="utf-8"))
        secret_lines = {line for line in K.solution_only_lines(nb) if line not in public}
        secret_tokens = set(K.hidden_tokens(nb, feedback=True)) - set(K.leaks(public, K.hidden_tokens(nb, feedback=True)))
        found += [f"{sol.relative_to(ROOT)}: {line}" for line in sorted(secret_lines) if line in text]
        found += [f"{sol.relative_to(ROOT)}: hidden {t}" for t in K.leaks(text, secret_tokens)]
    assert not found, "\n".join(found[:20])
