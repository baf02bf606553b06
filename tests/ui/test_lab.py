"""Real-browser test (``make test-ui``): JupyterLab + Debian's Chromium, driven by Playwright.

Starts JupyterLab on a free localhost port (no token) in a temporary folder holding a copy of
chapter 01 (the English one in ``make lab``'s Lab, the Chinese one in ``make lab-zh``'s), opens it in
Chromium, runs all cells, waits for the attention explorer, changes its mask, and checks that the heatmap
image changed. A screenshot lands in ``build/ui/``. The server is stopped by its process group in
``finally``. ``TINYTF_HEADLESS`` is removed from the server's environment so the live widget (not the
static figure) is what renders. ``make test-ui`` runs the tests two at once (pytest-xdist).

The browser is the system's Chromium (``CHROMIUM`` overrides ``/usr/bin/chromium``); this test
never downloads one.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.ui

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = ROOT / "notebooks" / "01_attention.ipynb"
CHAPTER_ZH = ROOT / "notebooks" / "zh" / "01_attention.ipynb"  # its twin, driven in the Chinese Lab
SHOTS = ROOT / "build" / "ui"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_server(url: str, proc: subprocess.Popen, log: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"JupyterLab did not answer at {url} within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    """Stop the server and its kernels: SIGTERM to its process group, SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


@contextlib.contextmanager
def serve_lab(work: Path, tmp_path: Path, config: str = "student", lang: str = "en") -> Iterator[str]:
    """JupyterLab on ``work`` in ``make lab``'s configuration (``lab/student``; ``"instructor"``:
    ``make lab-instructor``'s; ``lang="zh"``: ``make lab-zh``'s, whose settings overrides in ``lab/zh/settings``
    set JupyterLab's locale to zh_CN); yields its base URL and stops it, kernels included."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: install it (Debian: apt-get install chromium) or set CHROMIUM=/path/to/chromium")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("TINYTF_HEADLESS", "MPLBACKEND", "JUPYTER_CONFIG_PATH", "TINYTF_LANG")}
    env |= {"JUPYTER_RUNTIME_DIR": str(tmp_path / f"runtime-{config}"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / f"ws-{config}"),
            "JUPYTER_CONFIG_PATH": str(ROOT / "lab" / config), "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / f"user-settings-{config}-{lang}"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))}
    log = tmp_path / f"lab-{config}.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.token=", "--ServerApp.password=",
           f"--port={port}", "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1", f"--ServerApp.root_dir={work}",
           "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if lang == "zh":  # what `make lab-zh` adds to `make lab`
        cmd.append(f"--LabApp.app_settings_dir={ROOT / 'lab' / 'zh' / 'settings'}")
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_server(f"{base}/api/status", proc, log)
        yield base
    finally:
        stop(proc)


@contextlib.contextmanager
def browser_page(shot_name: str):
    """A Chromium page; on failure a screenshot of what it showed lands in build/ui/failure-<name>.png."""
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            try:
                yield page
            except Exception:
                page.screenshot(path=str(SHOTS / f"failure-{shot_name}.png"))
                raise
        finally:
            browser.close()


@pytest.fixture
def lab(tmp_path: Path):
    """The student's JupyterLab (``make lab``) on a copy of the English chapter 01; yields its base URL. The
    Chinese chapter is driven in the Chinese Lab (``make lab-zh``), where its students run it:
    test_the_chinese_lab_speaks_chinese."""
    work = tmp_path / "lab"
    work.mkdir()
    shutil.copy(CHAPTER, work / CHAPTER.name)
    with serve_lab(work, tmp_path) as base:
        yield base


def test_attention_explorer_reacts_in_a_real_browser(lab: str):
    with browser_page("en") as page:
        open_and_run_all(page, lab, CHAPTER.name)
        check_explorer(page, "en")


# what chapter 01's Chinese-sentence cell prints, per edition (the twins print in their own language)
TOKENS_PRINTED = {"en": re.compile(r"^12 tokens: 猫 坐 在"), "zh": re.compile(r"^12 个 token： 猫 坐 在")}

# the menu and status-bar words the test clicks and reads, per Lab language (zh: jupyterlab-language-pack-zh-CN)
LAB_WORDS = {"en": {"idle": "Idle", "run": "Run", "run_all": "Run All Cells", "no": "No"},
             "zh": {"idle": "空闲", "run": "运行", "run_all": "运行所有单元格", "no": "否"}}


def open_and_run_all(page, lab: str, name: str, lang: str = "en") -> None:
    """Open notebook ``name``, wait for its kernel, and start Run > Run All Cells (in the Lab's language)."""
    words = LAB_WORDS[lang]
    page.goto(f"{lab}/lab/tree/{name}", wait_until="domcontentloaded")
    page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").first.wait_for(timeout=90_000)
    # the kernel must be connected before "Run All": the status bar reads "<kernel name> | Idle"
    page.get_by_text(re.compile(rf"\|\s*{words['idle']}\s*$")).first.wait_for(timeout=120_000)
    no_news = page.get_by_role("button", name=words["no"], exact=True)  # the "Jupyter news?" toast, if it shows
    if no_news.count():
        no_news.first.click()
    started = page.locator(".jp-InputPrompt", has_text=re.compile(r"\[(\*|\d+)\]"))
    for _attempt in range(3):  # a Run All issued while the kernel is still connecting can be dropped
        page.locator(".lm-MenuBar-item", has_text=re.compile(rf"^{words['run']}")).first.click()  # menu Run > Run All Cells
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(rf"^{words['run_all']}$")).click()
        try:
            started.first.wait_for(timeout=20_000)
            break
        except Exception:
            page.keyboard.press("Escape")
    else:
        raise AssertionError("Run > Run All Cells did not start any cell")



def said(message: str, lang: str) -> str:
    """What tinytf says for ``message`` in edition ``lang`` (its gettext catalog, as the kernel reads it)."""
    from tinytf.translation import gettext

    old = os.environ.get("TINYTF_LANG")
    os.environ["TINYTF_LANG"] = lang
    try:
        return gettext(message)
    finally:
        if old is None:
            os.environ.pop("TINYTF_LANG")
        else:
            os.environ["TINYTF_LANG"] = old


def check_explorer(page, lang: str) -> None:
    """In chapter 01 (all cells started): change the explorer's mask, check the heatmap changed; the figure of
    a Chinese sentence renders (no missing glyph); the Chinese edition shows Chinese prose."""
    # the live figure is an ipywidgets Image (never an Output widget: tinytf.viz._front)
    explorer = page.locator(".widget-vbox", has=page.locator("img.widget-image")).first
    heatmap = explorer.locator("img.widget-image").first
    heatmap.wait_for(state="visible", timeout=150_000)
    before = heatmap.get_attribute("src")
    assert before, "the explorer's figure has no image"

    # the controls speak the edition's language (tinytf's message catalog): find them by what they say
    mask = explorer.locator(".widget-dropdown", has=page.locator("label", has_text=said("mask", lang))).locator("select")
    assert mask.evaluate("s => s.options[s.selectedIndex].text") == said("none", lang)
    mask.select_option(label=said("causal", lang))

    deadline = time.monotonic() + 60
    after = before
    while time.monotonic() < deadline and after == before:
        page.wait_for_timeout(250)
        img = explorer.locator("img.widget-image").first
        after = img.get_attribute("src") if img.count() else before
    assert after != before, "changing the mask did not redraw the heatmap"

    explorer.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    suffix = "" if lang == "en" else f"_{lang}"
    page.screenshot(path=str(SHOTS / f"attention_explorer{suffix}.png"))
    explorer.screenshot(path=str(SHOTS / f"attention_explorer_widget{suffix}.png"))
    if lang == "zh":
        assert page.get_by_text("注意力（Attention）").count(), "the Chinese chapter shows its Chinese title"
    tokens = page.locator(".jp-OutputArea-output", has_text=TOKENS_PRINTED[lang])  # the Chinese-sentence cell
    tokens.first.wait_for(timeout=120_000)
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    tracebacks = [t for t in errors.all_inner_texts() if "Traceback" in t or "Error" in t or "Glyph" in t]
    assert not tracebacks, tracebacks[:2]


def _student_tools(page) -> dict[str, int]:
    """How many of nbgrader's instructor tools (and its Validate button) this Lab page shows."""
    return {
        "Nbgrader menu": page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Nbgrader$")).count(),
        "Create Assignment panel": page.get_by_text("Create Assignment", exact=True).count(),
        "nbgrader Validate button": page.locator(".jp-Toolbar", has=page.get_by_text("Validate", exact=True)).count(),
    }


def test_the_student_lab_has_the_students_tools_only(tmp_path: Path):
    """``make lab``: no nbgrader instructor tools, the tinytf kernel, and the one way to check work — the
    self-check cell — reports a deleted test cell; ``make lab-instructor`` still has the tools."""
    import json

    sys.path.insert(0, str(ROOT / "tests"))
    import _coursekit as K

    work = tmp_path / "student"
    work.mkdir()
    rel, sol = K.load(ROOT / "exercises" / "ex01_by_hand.ipynb"), K.load(ROOT / "solutions" / "ex01_by_hand.ipynb")
    nb = K.without_cell(K.solved(rel, sol), "ex01_hand_qk")  # a student deleted a test cell
    (work / "ex01_by_hand.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    with serve_lab(work, tmp_path, "student") as base, browser_page("student-lab") as page:
        open_and_run_all(page, base, "ex01_by_hand.ipynb")
        assert page.locator(".jp-StatusBar-Widget", has_text="Python (tinytf)").count(), "the exercise runs on the tinytf kernel"
        shown = {tool: n for tool, n in _student_tools(page).items() if n}
        assert not shown, f"the student's Lab shows instructor tools: {shown}"
        verdict = page.locator(".jp-OutputArea-output", has_text="ex01 self-check").last
        verdict.wait_for(timeout=120_000)
        text = verdict.inner_text()
        assert "test cell ex01_hand_qk was deleted" in text and "Result: FAILED" in text, text
        verdict.scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / "student_lab_self_check.png"))
    with serve_lab(work, tmp_path, "instructor") as base, browser_page("instructor-lab") as page:
        page.goto(f"{base}/lab/tree/ex01_by_hand.ipynb", wait_until="domcontentloaded")
        page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").first.wait_for(timeout=90_000)
        page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Nbgrader$")).first.wait_for(timeout=30_000)
        tools = _student_tools(page)
        assert tools["Nbgrader menu"] and tools["Create Assignment panel"], f"make lab-instructor keeps nbgrader's tools: {tools}"


def test_the_chinese_lab_speaks_chinese(tmp_path: Path):
    """``make lab-zh``: JupyterLab's own menus in Chinese (文件, 编辑, from the zh_CN language pack), no instructor
    tools, and the Chinese chapter 01 running on the tinytf kernel, its attention explorer reacting in Chinese."""
    work = tmp_path / "zh"
    work.mkdir()
    shutil.copy(CHAPTER_ZH, work / CHAPTER.name)
    shutil.copy(CHAPTER_ZH.parent / "matplotlibrc", work / "matplotlibrc")  # its figure font
    with serve_lab(work, tmp_path, "student", lang="zh") as base, browser_page("zh-lab") as page:
        open_and_run_all(page, base, CHAPTER.name, lang="zh")
        check_explorer(page, "zh")  # the Chinese chapter's explorer speaks Chinese and reacts
        menus = page.locator(".lm-MenuBar-item").all_inner_texts()
        assert len(menus) >= 6, menus
        for word in ("文件", "编辑", "运行", "内核"):
            assert any(m.strip().startswith(word) for m in menus), f"no Chinese menu {word!r} in {menus}"
        assert not any(m.strip().startswith(("File", "Edit")) for m in menus), menus
        assert page.locator(".jp-StatusBar-Widget", has_text="Python (tinytf)").count(), "the chapter runs on the tinytf kernel"
        assert not {tool: n for tool, n in _student_tools(page).items() if n}, "the Chinese Lab is the student's Lab"
        page.locator(".lm-MenuBar-item", has_text=re.compile("^文件")).first.click()
        page.wait_for_timeout(300)
        page.screenshot(path=str(SHOTS / "zh_lab.png"))
        page.keyboard.press("Escape")
