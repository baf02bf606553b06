"""The message catalog (tinytf/translation.py, tinytf/locale/zh_CN/LC_MESSAGES/tinytf.po and its .mo).

- every message id Babel extracts from tinytf/ has a Chinese translation: present, not empty, not fuzzy,
  with only the placeholders of its msgid, and in the glossary's words (notebooks/zh/术语表.md);
- the shipped .mo is the compiled .po (a stale .mo fails);
- the Chinese persona of each diagnosis (TINYTF_LANG=zh): the pitfall checks on known-wrong code and
  every exercise's diagnosis on the wrong cases of tests/corpus say no Latin-script sentence outside code,
  identifiers, shapes, numbers and quoted exception text;
- a public-API error raised under zh reads Chinese and still names the shapes; in English nothing changes.
"""

from __future__ import annotations

import ast
import gettext
import json
import math
import re
import string
from pathlib import Path

import pytest
import torch
from babel.messages.extract import DEFAULT_KEYWORDS, extract_from_dir
from babel.messages.pofile import read_po
from test_glossary import glossary, prose

import tinytf
from tinytf import translation
from tinytf.checks import (
    Pitfall,
    diagnose_attention,
    diagnose_block,
    diagnose_causal_mask,
    diagnose_kv_grouping,
    diagnose_lm_loss,
    diagnose_online_softmax,
    diagnose_tiled_attention,
    diagnose_window,
    glance_table,
    report,
)
from tinytf.course.check.report import finding_lines
from tinytf.course.check.selfcheck import finding_json
from tinytf.course.messages import MESSAGES, PHRASES, say, translate

ROOT = Path(__file__).resolve().parents[1]
PO = ROOT / "tinytf" / "locale" / "zh_CN" / "LC_MESSAGES" / "tinytf.po"
MO = PO.with_suffix(".mo")
CORPUS = ROOT / "tests" / "corpus"


def _extracted() -> dict[str, str]:
    """msgid (the singular for ngettext) -> where it is said, for every message Babel finds in tinytf/."""
    found = {}
    for filename, lineno, message, _comments, _context in extract_from_dir(
            str(ROOT / "tinytf"), method_map=[("**.py", "python")], keywords=DEFAULT_KEYWORDS):
        msgid = message[0] if isinstance(message, tuple) else message
        found.setdefault(msgid, f"tinytf/{filename}:{lineno}")
    return found


def _catalog():
    with PO.open("rb") as fh:
        return read_po(fh, locale="zh_CN")


def _fields(text: str) -> set[str]:
    return {name.split(".")[0].split("[")[0] for _lit, name, _spec, _conv in string.Formatter().parse(text) if name is not None}


def test_every_message_id_has_a_chinese_translation():
    extracted = _extracted()
    assert len(extracted) >= 900, f"only {len(extracted)} message ids extracted from tinytf/"
    catalog = _catalog()
    problems = []
    for msgid, where in sorted(extracted.items()):
        m = catalog.get(msgid) or catalog.get((msgid, msgid))
        entry = next((e for e in catalog if (e.id[0] if isinstance(e.id, tuple) else e.id) == msgid), None) if m is None else m
        if entry is None:
            problems.append(f"missing: {msgid!r} ({where})")
            continue
        strings = entry.string if isinstance(entry.string, tuple) else (entry.string,)
        if not all(strings):
            problems.append(f"empty: {msgid!r} ({where})")
        if entry.fuzzy:
            problems.append(f"fuzzy: {msgid!r} ({where})")
    assert not problems, f"{len(problems)} untranslated messages (run make messages, then translate):\n" + "\n".join(problems[:40])


def test_the_catalog_holds_no_message_that_is_not_said():
    extracted = set(_extracted())
    ids = {e.id[0] if isinstance(e.id, tuple) else e.id for e in _catalog() if e.id}
    assert len(ids) >= 900, len(ids)
    assert not ids - extracted, f"obsolete msgids (run make messages): {sorted(ids - extracted)[:20]}"


def test_translations_keep_the_placeholders_and_the_glossarys_words():
    catalog = [e for e in _catalog() if e.id]
    assert len(catalog) >= 900, len(catalog)
    rules = [(zh, v) for zh, _en, variants in glossary() for v in variants if not v.isascii()]
    assert len(rules) >= 10, rules
    problems = []
    for e in catalog:
        msgid = e.id[0] if isinstance(e.id, tuple) else e.id
        for text in (e.string if isinstance(e.string, tuple) else (e.string,)):
            extra = _fields(text) - _fields(msgid)
            if extra:
                problems.append(f"{msgid!r}: placeholders {sorted(extra)} are not in the msgid")
            words = prose(text)
            problems += [f"{msgid!r}: {variant!r} -> {zh!r}" for zh, variant in rules if variant in words]
    assert not problems, "\n".join(problems)


def test_the_shipped_mo_is_the_compiled_po():
    with MO.open("rb") as fh:
        compiled = gettext.GNUTranslations(fh)
    entries = [e for e in _catalog() if e.id and not e.fuzzy]
    assert len(entries) >= 900, len(entries)
    stale = []
    for e in entries:
        if isinstance(e.id, tuple):
            got = compiled.ngettext(e.id[0], e.id[1], 1)
            want = e.string[0]
        else:
            got, want = compiled.gettext(e.id), e.string
        if got != want:
            stale.append(e.id)
    assert not stale, f"the .mo is out of date with the .po for {len(stale)} messages (run make messages): {stale[:5]}"
    assert PO.stat().st_size > 0 and MO.stat().st_size > 0


# ---- the language is chosen when a message is said --------------------------------------------------


def test_the_language_is_chosen_at_call_time(monkeypatch):
    monkeypatch.setenv("TINYTF_LANG", "en")
    assert translation._("mask ignored") == "mask ignored"
    monkeypatch.setenv("TINYTF_LANG", "zh")
    assert translation._("mask ignored") == "掩码被忽略"
    assert translation._("mask ignored", "en") == "mask ignored"  # an explicit language wins
    assert translation.ngettext("{n} problem found:", "{n} problems found:", 3).format(n=3) == "发现 3 个问题："
    assert translation._("a message that is not in the catalog") == "a message that is not in the catalog"


def test_messages_say_their_keys_in_both_languages():
    assert len(MESSAGES) >= 30 and len(PHRASES) >= 20
    for key, msgid in MESSAGES.items():
        fields = {name: 1 for name in _fields(msgid)}
        en, zh = say(key, "en", **fields), say(key, "zh", **fields)
        assert en == msgid.format(**fields), key
        assert re.search("[\u4e00-\u9fff]", zh) and zh != en, f"{key}: {zh!r}"
    assert say("verdict_failed", "zh") == "未通过"  # one word for "failed" in validate and on the feedback page
    assert translate("the notebook ran past the whole-notebook limit of 600 s and was stopped", "zh") == \
        "笔记本超过了整本的时间限制（600 秒），已被停止"


def test_glance_table_has_no_english_in_chinese():
    for chapter, n in (("08", 14), ("10", 4), ("11", 2), ("12", 9), ("13", 7)):
        table = glance_table("zh", chapter=chapter)
        rows = table.splitlines()[2:]
        assert len(rows) == n, (chapter, rows)
        latin = [s for s in map(_latin_sentences, rows) if s]
        assert not latin, latin
        assert "none: measure" not in table and "| 检测 |" in table.splitlines()[0]
    assert glance_table("en").splitlines()[0] == "| # | pitfall | symptom | detector | fix |"


# ---- the Chinese persona of each diagnosis ----------------------------------------------------------

_CODE = re.compile(r"`[^`]*`|\b\w*(?:Error|Exception|Warning)\b:?[^。；\n]*|https?://\S+")
_WORD = re.compile(r"[A-Za-z]+")


def _latin_sentences(text: str) -> list[str]:
    """Runs of three or more plain English words (letters only, not code, identifiers, shapes or numbers)
    separated by spaces or commas: what a Chinese student should not read."""
    text = _CODE.sub(" ", text)
    found = []
    for segment in re.split(r"[^\sA-Za-z,]+", text):
        words = segment.replace(",", " ").split()
        if len([w for w in words if len(w) >= 2]) >= 3 and all(_WORD.fullmatch(w) for w in words):
            found.append(segment.strip())
    return found


def test_the_latin_sentence_detector():
    assert _latin_sentences("the output is the same as without a mask.") == ["the output is the same as without a mask"]
    assert not _latin_sentences("输出与 softmax(q kᵀ / sqrt(d)) v 一致：q [2, 3, 5, 8]，k [2, 3, 7, 8]。")
    assert not _latin_sentences("它抛出了 RuntimeError: mat1 and mat2 shapes cannot be multiplied。")
    assert not _latin_sentences("用 `masked_fill(~mask, -inf)`，True 表示可以关注，batch 的 shape")
    assert _latin_sentences("证据：the scores are not divided by sqrt(d)…") == ["the scores are not divided by sqrt"]


def _said(findings) -> str:
    return "\n".join(line for f in findings for line in finding_lines(json.loads(json.dumps(finding_json(f))), "zh"))


def _attention(scale=None, transpose=False, mask_after=False):
    def fn(q, k, v, mask=None):
        s = (k @ q.transpose(-2, -1)) if transpose else (q @ k.transpose(-2, -1))
        s = s / math.sqrt(q.size(-1)) if scale is None else s * scale
        if mask is not None and not mask_after:
            s = s.masked_fill(~mask, float("-inf"))
        w = s.softmax(-1)
        return (w * mask if mask is not None and mask_after else w) @ v
    return fn


class _BatchNormBlock(torch.nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.dim, self.norm, self.ff = dim, torch.nn.BatchNorm1d(dim), torch.nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.ff(self.norm(x.transpose(1, 2)).transpose(1, 2))


def _online_no_rescale(m, run_sum, acc, s, v):
    m_new = torch.maximum(m, s.amax(-1, keepdim=True))
    p = torch.exp(s - m_new)
    return m_new, run_sum + p.sum(-1, keepdim=True), acc + p @ v


WRONG_CHECKS = {
    "attention without scaling": lambda: diagnose_attention(_attention(scale=1.0)),
    "attention with transposed scores": lambda: diagnose_attention(_attention(transpose=True)),
    "attention masked after the softmax": lambda: diagnose_attention(_attention(mask_after=True)),
    "causal mask off by one": lambda: diagnose_causal_mask(lambda t: torch.ones(t, t, dtype=torch.bool).tril(1)),
    "unshifted LM loss": lambda: diagnose_lm_loss(lambda logits, ids, pad_id=0: torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), ids.flatten(), ignore_index=pad_id)),
    "BatchNorm block": lambda: diagnose_block(_BatchNormBlock),
    "online softmax without rescaling": lambda: diagnose_online_softmax(_online_no_rescale),
    "tiled attention without the final division": lambda: diagnose_tiled_attention(
        lambda q, k, v, mask=None, block_q=2, block_k=3: (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).exp() @ v),
    "K/V heads tiled with repeat": lambda: diagnose_kv_grouping(
        lambda q, k, v: tinytf.scaled_dot_product_attention(q, k.repeat(1, q.size(1) // k.size(1), 1, 1),
                                                            v.repeat(1, q.size(1) // k.size(1), 1, 1))),
    "sliding window one too wide": lambda: diagnose_window(
        lambda tq, tk, w: tinytf.causal_mask(tq, tk, window=w + 1)),
}


@pytest.mark.parametrize("name", list(WRONG_CHECKS))
def test_the_checks_speak_chinese_on_wrong_code(name, monkeypatch):
    monkeypatch.setenv("TINYTF_LANG", "zh")
    findings = WRONG_CHECKS[name]()
    assert findings, f"{name}: the check found nothing wrong"
    text = _said(findings) + "\n" + report(findings)
    assert re.search("[\u4e00-\u9fff]", text)
    assert not _latin_sentences(text), f"{name}:\n{text}\n\nEnglish: {_latin_sentences(text)}"


def _definitions(source: str, test_cell: bool = False) -> str:
    """A cell's imports, functions and classes (the code a diagnosis calls), without its training runs; no
    assignment of a test cell (a hidden test may swap the student's function for the reference)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    keep = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)
    return "\n".join(ast.get_source_segment(source, n) for n in tree.body
                     if isinstance(n, keep) or not test_cell and _literal(n))


def _literal(node: ast.stmt) -> bool:
    """An assignment of a literal (a table typed by hand such as ``hand_qk = [[...]]``) or of a table of
    the functions defined above (``PATHS = {"explicit": explicit_attention, ...}``)."""
    if not isinstance(node, ast.Assign):
        return False
    allowed = (ast.Constant, ast.Name, ast.Dict, ast.List, ast.Tuple, ast.UnaryOp, ast.USub, ast.Load)
    return all(isinstance(n, allowed) for n in ast.walk(node.value))


def _namespace(case: dict) -> dict:
    import nbformat

    from tinytf.course.exercises import find_notebooks

    nb = nbformat.read(find_notebooks(ROOT / "solutions")[case["exercise"]], as_version=4)
    ns: dict = {"__name__": "__main__"}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        gid = meta.get("grade_id")
        if cell.cell_type == "code":
            code = _definitions(case["cells"].get(gid, cell.source), meta.get("grade", False) and not meta.get("solution", False))
            try:
                exec(compile(code, f"<{gid}>", "exec"), ns)  # noqa: S102 - our notebook and the corpus's code
            except Exception:  # noqa: BLE001, S112 - a definition that needs a skipped cell: the diagnosis says so
                continue
    return ns


WRONG_CASES = sorted(p for p in CORPUS.glob("ex[0-9][0-9]/*.json")
                     if not json.loads(p.read_text(encoding="utf-8"))["validate"]["clean"])


def test_the_corpus_has_its_wrong_cases():
    assert len(WRONG_CASES) >= 35, len(WRONG_CASES)


@pytest.mark.slow
@pytest.mark.parametrize("path", WRONG_CASES, ids=lambda p: f"{p.parent.name}-{p.stem}")
def test_each_diagnosis_speaks_chinese_on_a_wrong_case(path, monkeypatch):
    import importlib

    from tinytf.course.exercises import REFERENCE_MODULES as MODULES

    case = json.loads(path.read_text(encoding="utf-8"))
    monkeypatch.setenv("TINYTF_LANG", "zh")
    monkeypatch.setenv("TINYTF_DEVICE", "cpu")
    torch.manual_seed(0)
    findings = importlib.import_module(MODULES[case["exercise"]]).diagnose(_namespace(case))
    named = {Pitfall(int(f.pitfall)).name for f in findings}
    assert findings and set(case["validate"].get("pitfalls", [])) <= named, (path.name, named, [f.title for f in findings])
    text = _said(findings)
    assert not _latin_sentences(text), f"{path.name}:\n{text}\n\nEnglish: {_latin_sentences(text)}"


# ---- errors of the public API ------------------------------------------------------------------------


def test_a_public_api_error_reads_chinese_and_names_the_shapes(monkeypatch):
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 5)
    with pytest.raises(ValueError) as en:
        tinytf.scaled_dot_product_attention(q, k, k)
    assert str(en.value).startswith("q and k must have the same width d") and "[1, 2, 3, 4]" in str(en.value)
    monkeypatch.setenv("TINYTF_LANG", "zh")
    errors = []
    for call in (lambda: tinytf.scaled_dot_product_attention(q, k, k),
                 lambda: tinytf.causal_mask(4, 2),
                 lambda: tinytf.ModelConfig(dim=10, heads=3),
                 lambda: tinytf.scaled_dot_product_attention(q, q, q, mask=torch.ones(3, 3))):
        with pytest.raises(ValueError) as err:
            call()
        errors.append(str(err.value))
    assert len(errors) == 4
    assert "[1, 2, 3, 4]" in errors[0] and "[1, 2, 3, 5]" in errors[0] and "宽度 d 必须相同" in errors[0], errors[0]
    assert "t_q=4" in errors[1] and "末尾对齐" in errors[1], errors[1]
    assert "dim=10" in errors[2] and "heads=3" in errors[2] and "整除" in errors[2], errors[2]
    assert "torch.bool" in errors[3] and "[3, 3]" in errors[3], errors[3]
    for e in errors:
        assert re.search("[\u4e00-\u9fff]", e) and not _latin_sentences(e), e


def test_a_findings_pitfall_label_follows_the_language(monkeypatch):
    monkeypatch.setenv("TINYTF_LANG", "zh")
    assert Pitfall.SCALE.label() == "陷阱 1（缺少或用错 1/sqrt(d_head) 缩放）"
    assert Pitfall.SCALE.label("en") == "pitfall 1 (missing or wrong 1/sqrt(d_head) scaling)"
    assert report([]) == "没问题：没有发现任何问题。"


# ---- what tinytf.viz draws -------------------------------------------------------------------------

# the labels are checked as text; the CJK font that renders them is tests/test_viz_fonts.py's business
pytestmark_viz = pytest.mark.filterwarnings("ignore:Glyph .* missing from font:UserWarning")


@pytestmark_viz
def test_the_explorer_speaks_chinese_in_a_chinese_notebook(monkeypatch):
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    from tinytf.viz import attention_explorer

    monkeypatch.setenv("TINYTF_LANG", "zh")
    monkeypatch.setenv("TINYTF_HEADLESS", "0")
    ui = attention_explorer("a b c", heads=8, head=5)
    assert isinstance(ui, widgets.VBox)
    labels = [w.description for w in ui.children[0].children]
    assert len(labels) == 7 and labels == ["句子", "分词", "掩码", "缩放", "温度", "头数", "头"], labels
    ax, colorbar = ui.live.fig.axes[:2]
    assert ax.get_title().startswith("第 5 个头（共 8 个）· 掩码：因果") and "缩放 1/sqrt(" in ax.get_title(), ax.get_title()
    mask = ui.children[0].children[2]
    assert [label for label, _value in mask.options] == ["无", "因果", "填充", "两者都用"] and mask.value == "causal"  # values unchanged
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("键（被关注）", "查询（发起关注）")
    assert colorbar.get_ylabel() == "权重（每行之和为 1）"
    plt.close("all")


@pytestmark_viz
def test_every_figure_label_is_chinese_in_a_chinese_notebook(monkeypatch):
    import matplotlib.pyplot as plt

    from tinytf.viz import cache_figure, memory_figure, online_softmax_figure

    monkeypatch.setenv("TINYTF_LANG", "zh")
    figures = {"kv cache": cache_figure(), "memory": memory_figure(), "online softmax": online_softmax_figure()}
    assert len(figures) == 3
    for name, fig in figures.items():
        texts = [t for ax in fig.axes for t in (ax.get_title(), ax.get_xlabel(), ax.get_ylabel())]
        texts += [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
        texts += [fig._suptitle.get_text()] if fig._suptitle is not None else []
        said = [t for t in texts if t.strip()]
        assert len(said) >= 4, (name, said)
        assert any(re.search("[\u4e00-\u9fff]", t) for t in said), (name, said)
        assert not [t for t in said if _latin_sentences(t)], (name, [_latin_sentences(t) for t in said])
    plt.close("all")


def _typed_in_scale(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / 8  # sqrt(64) typed in
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return s.softmax(-1) @ v


def _pad_counted(logits, ids, pad_id=None):
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))


def _one_ring_buffer(q, k, v, *, layout, comm, is_causal):
    """One rank's ring forward that receives into the block it computes with (one buffer, not two)."""
    def positions_of(chunks):
        return torch.cat([torch.arange(a, b) for a, b in chunks])

    m = q.new_full((*q.shape[:-1], 1), -math.inf)
    total, acc, held = torch.zeros_like(m), torch.zeros_like(q), [k, v]
    for step in range(comm.world):
        src = (comm.rank - step) % comm.world
        pending = comm.post_exchange(held, held) if step < comm.world - 1 else None
        s = q @ held[0].transpose(-2, -1) / math.sqrt(q.size(-1))
        s = s.masked_fill(positions_of(layout[src])[None, :] > positions_of(layout[comm.rank])[:, None], -math.inf)
        m, total, acc = tinytf.online_softmax_update(m, total, acc, s, held[1])
        if pending is not None:
            held = pending.wait()
    return tinytf.online_softmax_finish(m, total, acc)[0]


def test_the_checks_join_their_chinese_sentences(monkeypatch):
    """The glue between the parts of a finding is Chinese too: no English "and", "on", "(want ...)", "; " or
    a sentence fragment after "。", and no space after Chinese punctuation (chapter 08's and 12's printouts)."""
    from tinytf.checks import diagnose_overlapped_ring, diagnose_qkv_split

    monkeypatch.setenv("TINYTF_LANG", "zh")
    findings = {
        "typed-in scale": diagnose_attention(_typed_in_scale),
        "padding counted": diagnose_lm_loss(_pad_counted),
        "unshifted": WRONG_CHECKS["unshifted LM loss"](),
        "one-piece QKV split": diagnose_qkv_split(lambda w, rank, world, heads, kv_heads: w.chunk(world)[rank]),
        "one ring buffer": diagnose_overlapped_ring(_one_ring_buffer),
    }
    assert len(findings) == 5 and all(findings.values()), {k: len(v) for k, v in findings.items()}
    for name, found in findings.items():
        text = report(found)
        prose_only = re.sub(r"\[[^\]]*\]|\w+\([^()]*\)", "", text)  # [W_q; W_k; W_v], shapes, calls: code, not prose
        for english in (" and ", "(want ", " on ", "; ", "。 ", "； ", "contiguous", "for rank"):
            assert english not in prose_only, f"{name}: {english!r} in\n{text}"
        assert not _latin_sentences(prose_only), f"{name}:\n{text}"
    assert "出现在" in report(findings["one ring buffer"]) and "连续拆分" in report(findings["one ring buffer"])


def test_the_model_api_speaks_chinese(monkeypatch):
    """lm, generate and bench: the errors, the warning and the benchmark line a chapter prints read Chinese
    under zh (chapter 13's position table and max_tokens messages, chapter 14's benchmark line)."""
    import warnings

    from tinytf.bench import benchmark, sdpa_backend

    model = tinytf.TinyLanguageModel(vocab=16, dim=16, heads=2, layers=1, max_tokens=8)
    monkeypatch.setenv("TINYTF_LANG", "zh")
    said = []
    for call in (lambda: model(torch.zeros(1, 9, dtype=torch.long)),
                 lambda: model(torch.zeros(1, 9)),
                 lambda: tinytf.lm_loss(torch.zeros(1, 3, 16), torch.zeros(1, 4, dtype=torch.long)),
                 lambda: tinytf.generate(model, torch.zeros(4, dtype=torch.long), 2),
                 lambda: tinytf.generate(model, torch.zeros(1, 9, dtype=torch.long), 2)):
        with pytest.raises(ValueError) as err:
            call()
        said.append(str(err.value))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tinytf.generate(model, torch.zeros(1, 4, dtype=torch.long), 8)
    said.append(str(caught[0].message))
    q = torch.randn(1, 2, 8, 4)
    said += [str(benchmark(lambda: q @ q.transpose(-1, -2), warmup=1, iters=2, name="q @ kᵀ")),
             sdpa_backend(q, q, q, is_causal=True), sdpa_backend(q, q, q, attn_mask=torch.zeros(2, 8, 8))]
    assert len(said) == 9
    assert "max_tokens=8" in said[0] and "[1, 9]" in said[0] and "positions='rope'" in said[0], said[0]
    assert "max_tokens=8" in said[5] and "4 个新 token" in said[5], said[5]
    for text in said:
        assert re.search("[\u4e00-\u9fff]", text) and not _latin_sentences(text), text
