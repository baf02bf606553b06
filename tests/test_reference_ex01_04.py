"""Judges and diagnoses of exercises 1–4 (tinytf/course/reference/ex01.py … ex04.py).

The instructor notebooks are the single source of truth: their solution cells are executed here
(in-process, CPU, small sizes) to get the reference answers, their test cells are executed with
``TINYTF_RECORD_DIR`` set so the hidden tests export what the clean-process judges see. Then:
- every graded cell records exactly once and its judge accepts the reference answer;
- each judge rejects wrong answers (including the buggy variants ``diagnose`` targets);
- ``diagnose`` says nothing about the reference answers and names the pitfall on buggy ones;
- nothing crashes on unfinished stubs (functions that raise NotImplementedError).

No test here reads the wall clock: the timing parts of exercise 3 (``time_forward`` and its judges
and diagnosis, which time modules that ``time.sleep``) run on a :class:`FakeClock`, so the measured
seconds are exact and a loaded machine cannot fail a test.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import time
from pathlib import Path
from typing import Any

import _runner as R
import pytest
import torch
from torch import nn

from tinytf.bench import one_thread
from tinytf.checks import Pitfall
from tinytf.course.reference import ex01, ex02, ex03, ex04
from tinytf.course.reference import judging as judges
from tinytf.course.reference.judging import RECORD_ENV, load_records

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = {
    "ex01": "ex01_by_hand.ipynb",
    "ex02": "ex02_padding_mask.ipynb",
    "ex03": "ex03_heads.ipynb",
    "ex04": "ex04_pre_post_norm.ipynb",
}
# cells too slow for a unit test; the comparison runs with STEPS overridden below
SKIP = {"ex03_table", "ex04_plot"}


class FakeClock:
    """A virtual clock for ``time.perf_counter`` / ``time.monotonic``: ``time.sleep(s)`` advances it by
    exactly ``s`` and every reading by one ``tick`` (so that two readings always differ, as on a real clock)."""

    def __init__(self, tick: float = 1e-6) -> None:
        self.now, self.tick = 1000.0, tick

    def read(self) -> float:
        self.now += self.tick
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def install(self, mp: pytest.MonkeyPatch) -> FakeClock:
        for name in ("perf_counter", "monotonic"):
            mp.setattr(time, name, self.read)
        mp.setattr(time, "sleep", self.sleep)
        return self


@pytest.fixture
def fake_clock(monkeypatch) -> FakeClock:
    return FakeClock().install(monkeypatch)


def _cells(ex: str) -> dict[str, Any]:
    return R.notebook_cells(NOTEBOOKS[ex])


def _grade(cell: Any) -> dict:
    """The cell's nbgrader metadata (empty for a cell without)."""
    return cell.metadata.get("nbgrader", {})


def _grade_cells(ex: str) -> list[Any]:
    return [c for c in _cells(ex).values() if c.cell_type == "code" and _grade(c).get("grade")]


def _run_notebook(ex: str, record_dir: Path, monkeypatch, *, sources: dict[str, str] | None = None,
                  failures: dict[str, str | None] | None = None) -> dict:
    """Execute the notebook's code cells in one namespace (CPU, headless, recording into ``record_dir``), the
    self-check and the slow cells (SKIP) left out. ``sources`` and ``failures`` as in
    :func:`_runner.run_cells` (a corpus case's cells in place; a raising cell does not stop the run)."""
    monkeypatch.setenv("TINYTF_DEVICE", "cpu")
    monkeypatch.setenv("TINYTF_HEADLESS", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv(RECORD_ENV, str(record_dir))
    cells = _cells(ex)
    ids = [gid for gid, c in cells.items() if c.cell_type == "code" and gid not in SKIP and not gid.endswith("_self_check")]
    ns: dict = {"__name__": f"__{ex}__"}
    if "ex04_compare_answer" in ids:  # the comparison's structure, not its length, is what is judged
        at = ids.index("ex04_compare_answer")
        R.run_cells(cells, ids[:at], ns, sources=sources, failures=failures)
        ns["STEPS"], ids = 8, ids[at:]
    return R.run_cells(cells, ids, ns, sources=sources, failures=failures)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny tensors: one intra-op thread is faster and avoids oversubscribing a shared CPU."""
    with one_thread():
        yield


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory) -> dict[str, tuple[dict, dict]]:
    """``{ex: (namespace, records)}`` from executing each instructor notebook with recording on."""
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        FakeClock().install(mp)  # ex03's hidden tests time modules that sleep: exact seconds, whatever the load
        for ex in NOTEBOOKS:
            folder = tmp_path_factory.mktemp(f"records_{ex}")
            torch.manual_seed(0)
            ns = _run_notebook(ex, folder, mp)
            out[ex] = (ns, load_records(folder))
    return out


# ---- structure: one judge per graded cell, one record per hidden test ------------------------------


@pytest.mark.parametrize("ex", sorted(NOTEBOOKS))
def test_every_graded_cell_has_a_judge_and_records_itself_once(ex):
    registered = judges.load_all()
    cells = _grade_cells(ex)
    assert cells, f"{ex} has no graded cells"
    for cell in cells:
        gid = _grade(cell)["grade_id"]
        assert gid.startswith(f"{ex}_") and re.fullmatch(r"[A-Za-z0-9_-]+", gid)
        assert gid in registered, f"no judge registered for {gid}"
        hidden = cell.source.split("### BEGIN HIDDEN TESTS", 1)
        assert len(hidden) == 2 and "### END HIDDEN TESTS" in hidden[1], f"{gid} has no hidden-test block"
        calls = re.findall(r'record\(\s*"([^"]+)"', hidden[1])
        assert calls == [gid], f"{gid}: the hidden tests must call record({gid!r}, ...) exactly once, found {calls}"
        assert "record(" not in hidden[0], f"{gid}: record(...) must stay in the hidden part"


@pytest.mark.parametrize("ex", sorted(NOTEBOOKS))
def test_points_are_sensible(ex):
    cells = [c for c in _cells(ex).values() if _grade(c).get("grade")]
    auto = sum(_grade(c)["points"] for c in cells if c.cell_type == "code")
    manual = sum(_grade(c)["points"] for c in cells if c.cell_type == "markdown")
    assert 10 <= auto + manual <= 20, (ex, auto, manual)
    assert auto >= manual


# ---- judges accept the reference answer -------------------------------------------------------------


@pytest.mark.parametrize("ex", sorted(NOTEBOOKS))
def test_judges_accept_the_reference_answers(reference_runs, ex):
    _, records = reference_runs[ex]
    for cell in _grade_cells(ex):
        gid = _grade(cell)["grade_id"]
        assert gid in records, f"{gid} did not record anything"
        ok, msg = judges.run_judge(gid, records[gid]["value"], records[gid]["inputs"])
        assert ok, f"{gid}: the judge rejects the reference answer: {msg}"


# ---- judges reject wrong answers -----------------------------------------------------------------


def test_ex01_judges_reject_wrong_answers(reference_runs):
    _, rec = reference_runs["ex01"]
    r = rec["ex01_hand_qk"]
    R.rejects("ex01_hand_qk", r["value"].T.contiguous() + torch.eye(3), r["inputs"])
    R.rejects("ex01_hand_qk", r["value"], {**r["inputs"], "q": r["inputs"]["q"] * 2})  # tampered example
    r = rec["ex01_scores"]
    q, k = r["inputs"]["q"], r["inputs"]["k"]
    R.rejects("ex01_scores", q @ k.transpose(-2, -1), r["inputs"])  # Pitfall.SCALE: no scaling
    msg = R.rejects("ex01_scores", q @ k.transpose(-2, -1) / q.size(-1), r["inputs"])  # 1/d
    want = r["value"]
    assert f"scores_by_hand(q, k) differs from q @ kᵀ / sqrt(d): for q {list(q.shape)}, k {list(k.shape)} should be {list(want.shape)} " \
           f"starting [{float(want.reshape(-1)[0]):.4g}, " in msg, msg  # which output, which inputs, the correct shape and first entries
    d = q.size(-1)
    root = math.isqrt(d)  # the hidden test draws d afresh: 1/sqrt(d) is "half" for d = 4, "1/3 of" for 9, "1/sqrt(8) = …" for 8
    ratio = ("half the right value" if d == 4 else f"1/{root} of the right value" if root * root == d
             else f"1/sqrt({d}) = 1/{math.sqrt(d):.3g} of the right value")
    assert msg.endswith(f" — exactly {ratio}: divided by d = {d} instead of sqrt(d)"), msg  # the ratio named
    R.rejects("ex01_scores", r["value"][..., :1], r["inputs"])  # wrong shape
    R.rejects("ex01_scores", "not a tensor", r["inputs"])
    r = rec["ex01_softmax"]
    s, big = r["inputs"]["scores"], r["inputs"]["large"]
    R.rejects("ex01_softmax", {"weights": s.softmax(-2), "large": big.softmax(-1)}, r["inputs"])  # wrong axis
    R.rejects("ex01_softmax", {"weights": s.softmax(-1), "large": big.exp() / big.exp().sum(-1, keepdim=True)}, r["inputs"])  # overflow
    R.rejects("ex01_softmax", {"weights": s.softmax(-1)}, r["inputs"])
    r = rec["ex01_attention"]
    out, w = r["value"]["out"], r["value"]["weights"]
    R.rejects("ex01_attention", {"out": out * 1.01, "weights": w}, r["inputs"])
    R.rejects("ex01_attention", {"out": out, "weights": w.flip(-1)}, r["inputs"])


def test_ex02_judges_reject_wrong_answers(reference_runs):
    _, rec = reference_runs["ex02"]
    r = rec["ex02_mask"]
    R.rejects("ex02_mask", ~r["value"], r["inputs"])  # inverted convention
    R.rejects("ex02_mask", r["value"][:, 0, 0, :], r["inputs"])  # [B, T] instead of [B, 1, 1, T]
    R.rejects("ex02_mask", r["value"].float(), r["inputs"])  # not bool
    r = rec["ex02_masked_softmax"]
    s, m = r["inputs"]["scores"], r["inputs"]["mask"]
    R.rejects("ex02_masked_softmax", s.softmax(-1) * m, r["inputs"])  # Pitfall.MASK: after the softmax
    R.rejects("ex02_masked_softmax", s.masked_fill(~m, -1e4).softmax(-1) + 1e-6 * (~m), r["inputs"])  # not exactly zero
    R.rejects("ex02_masked_softmax", s.masked_fill(m, float("-inf")).softmax(-1).nan_to_num(), r["inputs"])  # inverted
    r = rec["ex02_renormalise"]
    R.rejects("ex02_renormalise", r["inputs"]["weights"] * r["inputs"]["mask"], r["inputs"])  # not rescaled
    r = rec["ex02_attention"]
    inp = r["inputs"]
    R.rejects("ex02_attention", {"masked": r["value"]["unmasked"], "unmasked": r["value"]["unmasked"]}, inp)  # mask ignored
    R.rejects("ex02_attention", {"masked": r["value"]["masked"]}, inp)


def test_ex03_judges_reject_wrong_answers(reference_runs):
    _, rec = reference_runs["ex03"]
    r = rec["ex03_param_count"]
    R.rejects("ex03_param_count", [4 * d * d + (0 if b else 4 * d) for d, _, b in r["inputs"]["cases"]], r["inputs"])  # bias flipped
    R.rejects("ex03_param_count", [n // h for n, (_, h, _) in zip(r["value"], r["inputs"]["cases"])] if any(
        h > 1 for _, h, _ in r["inputs"]["cases"]) else [n + 1 for n in r["value"]], r["inputs"])
    R.rejects("ex03_param_count", [float(n) for n in r["value"]], r["inputs"])
    r = rec["ex03_timing"]
    R.rejects("ex03_timing", {**r["value"], "cold_s": 0.3}, r["inputs"])  # cold call included
    R.rejects("ex03_timing", {**r["value"], "steady_s": r["value"]["steady_s"] * 1000}, r["inputs"])  # milliseconds
    R.rejects("ex03_timing", {**r["value"], "calls": 1}, r["inputs"])
    R.rejects("ex03_timing", {**r["value"], "steady_s": float("nan")}, r["inputs"])
    r = rec["ex03_head_maps"]
    R.rejects("ex03_head_maps", r["value"].transpose(-2, -1), r["inputs"])
    R.rejects("ex03_head_maps", r["value"][:, :1], r["inputs"])
    r = rec["ex03_results"]
    bad = {h: dict(v) for h, v in r["value"].items()}
    bad["2"]["params"] += 16
    R.rejects("ex03_results", bad, r["inputs"])
    bad = {h: dict(v) for h, v in r["value"].items()}
    bad["4"]["weights"] = bad["4"]["weights"][:, :1]
    R.rejects("ex03_results", bad, r["inputs"])
    assert r["inputs"]["maps_sum_to_one"] is True
    columns = {h: {**v, "weights": v["weights"].transpose(-2, -1).contiguous()} for h, v in r["value"].items()}  # softmax over queries
    assert "rows must sum to one" in R.rejects("ex03_results", columns, r["inputs"])
    ok, msg = judges.run_judge("ex03_results", columns, {**r["inputs"], "maps_sum_to_one": False})
    assert ok, f"a wrong per_head_weights costs Task 3c only, not the experiment: {msg}"


def test_ex04_judges_reject_wrong_answers(reference_runs):
    _, rec = reference_runs["ex04"]
    pre, post = rec["ex04_pre_block"], rec["ex04_post_block"]
    other = ex04.reference_block_output(**{**pre["inputs"], "norm": "post"})
    R.rejects("ex04_pre_block", other, pre["inputs"])  # the other layout
    R.rejects("ex04_pre_block", pre["value"], {**pre["inputs"], "norm": "post"})  # record for the wrong layout
    other = ex04.reference_block_output(**{**post["inputs"], "norm": "pre"})
    R.rejects("ex04_post_block", other, post["inputs"])
    msg = R.rejects("ex04_post_block", post["value"] + 1e-3, post["inputs"])
    x_shape = list(post["inputs"]["x"].shape)
    assert f"PostNormBlock(x) differs from tinytf.TransformerBlock(norm='post') with the same weights: for x {x_shape}" in msg and \
            f"should be {list(post['value'].shape)} starting [" in msg, msg
    r = rec["ex04_train"]
    second = {"loss": [v * 1.01 for v in r["value"]["second"]["loss"]], "grad_norm": r["value"]["second"]["grad_norm"]}
    R.rejects("ex04_train", {"first": r["value"]["first"], "second": second}, r["inputs"])  # not reproducible
    R.rejects("ex04_train", r["value"], {**r["inputs"], "factory_calls": 2})  # factory ignored
    short = {k: {kk: vv[:-1] for kk, vv in v.items()} for k, v in r["value"].items()}
    R.rejects("ex04_train", short, r["inputs"])
    r = rec["ex04_comparison"]
    value = dict(r["value"])
    value.pop(sorted(value)[0])
    R.rejects("ex04_comparison", value, r["inputs"])
    nan = {k: {"loss": [float("nan")] * len(v["loss"]), "grad_norm": v["grad_norm"]} for k, v in r["value"].items()}
    R.rejects("ex04_comparison", nan, r["inputs"])


# ---- diagnose: silent on the reference, names the pitfall on buggy code ----------------------------


def _pitfalls(findings) -> list[Pitfall]:
    return [f.pitfall for f in findings]


def _titles(findings) -> str:
    return " | ".join(f.title for f in findings)


@pytest.mark.parametrize("ex,mod", [("ex01", ex01), ("ex02", ex02), ("ex03", ex03), ("ex04", ex04)])
def test_diagnose_is_silent_on_the_reference(reference_runs, fake_clock, ex, mod):
    ns, _ = reference_runs[ex]
    assert mod.diagnose(ns) == [], _titles(mod.diagnose(ns))


def _stub(*args, **kwargs):
    raise NotImplementedError()


@pytest.mark.parametrize("ex,mod,names", [
    ("ex01", ex01, ["scores_by_hand", "softmax_by_hand", "attention_by_hand"]),
    ("ex02", ex02, ["build_padding_mask", "masked_softmax", "renormalise", "padded_attention"]),
    ("ex03", ex03, ["mha_parameter_count", "time_forward", "per_head_weights"]),
    ("ex04", ex04, ["PreNormBlock", "PostNormBlock", "train_curve"]),
])
def test_diagnose_reports_stubs_and_missing_names_without_raising(ex, mod, names):
    findings = mod.diagnose({name: _stub for name in names})
    text = _titles(findings)
    for name in names:
        assert f"{name} is not implemented yet" in text, text
    missing = mod.diagnose({})
    assert all(f"{name} is missing" in _titles(missing) for name in names)


def test_ex01_diagnose_names_the_pitfall(reference_runs):
    ns, _ = reference_runs["ex01"]

    def variant(**fns):
        return ex01.diagnose({**ns, **fns})

    unscaled = variant(scores_by_hand=lambda q, k: q @ k.transpose(-2, -1))
    assert Pitfall.SCALE in _pitfalls(unscaled) and "not divided by sqrt(d)" in _titles(unscaled)  # its mutant (issue 35)
    assert "attention_by_hand" not in _titles(unscaled), "Task 1d is judged on tinytf's scores, not on the wrong ones"
    assert Pitfall.SCALE in _pitfalls(variant(scores_by_hand=lambda q, k: q @ k.transpose(-2, -1) / q.size(-1)))
    assert Pitfall.ORIENTATION in _pitfalls(variant(scores_by_hand=lambda q, k: k @ q.transpose(-2, -1) / math.sqrt(q.size(-1))))
    def over_queries(s):
        e = (s - s.amax(-2, keepdim=True)).exp()
        return e / e.sum(-2, keepdim=True)

    wrong_axis = variant(softmax_by_hand=over_queries)
    assert Pitfall.ORIENTATION in _pitfalls(wrong_axis) and "normalises over the queries" in _titles(wrong_axis)
    two_mistakes = variant(softmax_by_hand=lambda s: s.exp() / s.exp().sum(-2, keepdim=True))  # no shift and the wrong axis
    assert "sum to one" in _titles(two_mistakes) and "queries" not in " ".join(f.fix for f in two_mistakes), (
        "no single mistake fits: the symptom, and no fix that belongs to another mistake")
    overflow = variant(softmax_by_hand=lambda s: s.exp() / s.exp().sum(-1, keepdim=True))
    assert "overflows" in _titles(overflow)
    assert "(out, weights)" in _titles(variant(attention_by_hand=lambda q, k, v: ns["attention_by_hand"](q, k, v)[0]))
    assert "hand_qk" in _titles(variant(hand_qk=[[1, 0, 1], [0, 2, 2], [1, 2, 1]]))
    assert "hand_qk" in _titles(ex01.diagnose({k: v for k, v in ns.items() if k != "hand_qk"}))


def test_ex02_diagnose_names_the_pitfall(reference_runs):
    ns, _ = reference_runs["ex02"]
    mask_fn, softmax_fn = ns["build_padding_mask"], ns["masked_softmax"]

    def variant(**fns):
        return ex02.diagnose({**ns, **fns})

    inverted = variant(build_padding_mask=lambda lengths, t, device=None: ~mask_fn(lengths, t, device))
    assert Pitfall.MASK in _pitfalls(inverted) and "inverted" in _titles(inverted)
    flat = variant(build_padding_mask=lambda lengths, t, device=None: mask_fn(lengths, t, device)[:, 0, 0, :])
    assert "returns a [B, t] mask" in _titles(flat) and "[:, None, None, :]" in " ".join(f.message for f in flat)
    after = variant(masked_softmax=lambda s, m: s.softmax(-1) * m)
    assert Pitfall.MASK in _pitfalls(after) and "after the softmax" in _titles(after)
    assert Pitfall.MASK in _pitfalls(variant(masked_softmax=lambda s, m: s.masked_fill(m, float("-inf")).softmax(-1)))
    assert Pitfall.MASK in _pitfalls(variant(renormalise=lambda w, m: w * m))

    def ignores_mask(q, k, v, mask=None):
        return (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).softmax(-1) @ v

    def mask_after(q, k, v, mask=None):
        w = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).softmax(-1)
        return (w if mask is None else w * mask) @ v

    def unscaled(q, k, v, mask=None):
        s = q @ k.transpose(-2, -1)
        return (s if mask is None else s.masked_fill(~mask, float("-inf"))).softmax(-1) @ v

    assert Pitfall.MASK in _pitfalls(variant(padded_attention=ignores_mask))
    assert Pitfall.MASK in _pitfalls(variant(padded_attention=mask_after))
    assert Pitfall.SCALE in _pitfalls(variant(padded_attention=unscaled))
    assert softmax_fn is ns["masked_softmax"]


def test_ex03_diagnose_names_the_problem(reference_runs, fake_clock):
    ns, _ = reference_runs["ex03"]

    def variant(**fns):
        return ex03.diagnose({**ns, **fns})

    no_bias = variant(mha_parameter_count=lambda dim, heads, bias=True: 4 * dim * dim)
    assert "leaves out the biases" in _titles(no_bias) and "bias" in no_bias[0].message  # its mutant (issue 35)
    per_head = variant(mha_parameter_count=lambda dim, heads, bias=True: (4 * dim * dim + 4 * dim * bias) // heads)
    assert "divides by the head count" in _titles(per_head)

    timing = {
        "returns the total": lambda module, x, repeats=20, warmup=3: _loop_seconds(module, x, repeats),
        "cold": lambda module, x, repeats=20, warmup=3: _loop_seconds(module, x, repeats) / repeats,
        "milliseconds": lambda module, x, repeats=20, warmup=3: 1e3 * ns["time_forward"](module, x, repeats, warmup),
        "measures too little": lambda module, x, repeats=20, warmup=3: _loop_seconds(module, x, 0) + 1e-6,
    }
    for title, timer in timing.items():
        found = variant(time_forward=timer)
        assert _pitfalls(found) == [Pitfall.COLD_TIMING] and title in _titles(found), (title, _titles(found))

    def maps(scale_by, reshape_wrong=False, axis=-1):
        def fn(mha, x):
            b, t, d = x.shape
            q, k, _ = mha.qkv(x).chunk(3, dim=-1)
            if reshape_wrong:
                q, k = q.reshape(b, mha.heads, t, mha.head_dim), k.reshape(b, mha.heads, t, mha.head_dim)
            else:
                q = q.view(b, t, mha.heads, mha.head_dim).transpose(1, 2)
                k = k.view(b, t, mha.heads, mha.head_dim).transpose(1, 2)
            return (q @ k.transpose(-2, -1) / scale_by(mha)).softmax(axis)
        return fn

    assert Pitfall.SCALE in _pitfalls(variant(per_head_weights=maps(lambda m: 1.0)))
    assert Pitfall.SCALE in _pitfalls(variant(per_head_weights=maps(lambda m: math.sqrt(m.dim))))
    assert Pitfall.ORIENTATION in _pitfalls(variant(per_head_weights=maps(lambda m: math.sqrt(m.head_dim), axis=-2)))
    assert Pitfall.VIEW_AFTER_TRANSPOSE in _pitfalls(variant(per_head_weights=maps(lambda m: math.sqrt(m.head_dim), reshape_wrong=True)))


def _loop_seconds(module, x, repeats: int) -> float:
    """A naive timer: one clock reading around ``repeats`` calls, no warm-up (what students often write)."""
    start = time.perf_counter()
    for _ in range(repeats):
        module(x)
    return time.perf_counter() - start


def _loaded(clock: FakeClock, monkeypatch, load: float, seed: int) -> None:
    """A busy machine on the fake clock: every sleep takes ``load`` times longer plus a random wake-up
    delay (up to ``load`` x 5 ms), and every clock reading costs up to ``load`` x 50 µs."""
    rng = random.Random(seed)
    monkeypatch.setattr(time, "sleep", lambda s: clock.sleep(s * load + rng.uniform(0, 0.005 * load)))
    clock.tick = 0.0

    def read() -> float:
        clock.now += rng.uniform(1e-7, 5e-5 * load)
        return clock.now

    for name in ("perf_counter", "monotonic"):
        monkeypatch.setattr(time, name, read)


@pytest.mark.parametrize("load", [1.0, 4.0, 20.0])
def test_ex03_timing_judge_gives_a_correct_answer_full_marks_however_busy_the_machine(reference_runs, fake_clock,
                                                                                       monkeypatch, load):
    """The judge compares times only with times measured beside them: twenty runs of a correct
    time_forward on a machine 1, 4 and 20 times slower (random delays) all pass; the wrong timers all fail."""
    ns, _ = reference_runs["ex03"]

    def mean_with_cold_call(module, x, repeats=20, warmup=3):  # no warm-up: the slow first call is timed
        return _loop_seconds(module, x, repeats) / repeats

    def warmup_timed_too(module, x, repeats=20, warmup=3):  # warm-up calls inside the timed loop
        return _loop_seconds(module, x, warmup + repeats) / (warmup + repeats)

    def total(module, x, repeats=20, warmup=3):
        return _loop_seconds(module, x, repeats)

    def millis(module, x, repeats=20, warmup=3):
        return 1000 * ns["time_forward"](module, x, repeats=repeats, warmup=warmup)

    for run in range(20):
        _loaded(fake_clock, monkeypatch, load, seed=run)
        reps, sleep_s = 6 + run % 5, 0.001 * (2 + run % 3)
        good = ex03.timing_record(ns["time_forward"], reps, sleep_s)
        assert ex03.timing_problem(good, reps) is None, (load, run, good)
        ok, msg = judges.run_judge("ex03_timing", good, {"sleep_s": sleep_s, "repeats": reps})
        assert ok, msg
        for wrong, words in ((mean_with_cold_call, ""), (warmup_timed_too, ""), (total, "implausible"), (millis, "implausible")):
            problem = ex03.timing_problem(ex03.timing_record(wrong, reps, sleep_s), reps)  # a mean may fail the steady bound first
            assert problem and words in problem, (wrong.__name__, load, run)


def test_ex03_the_notebook_records_what_the_judge_reads(reference_runs):
    _, rec = reference_runs["ex03"]
    value = rec["ex03_timing"]["value"]
    assert len(value["steady_inner"]) >= rec["ex03_timing"]["inputs"]["repeats"] and value["cold_inner"][0] >= 0.5


def test_ex04_diagnose_names_the_problem(reference_runs):
    import tinytf

    ns, _ = reference_runs["ex04"]
    pre_cls, post_cls = ns["PreNormBlock"], ns["PostNormBlock"]

    class PostIsPre(pre_cls):  # "post-norm" that still computes pre-norm
        pass

    class PreIsPost(post_cls):
        pass

    class LeakyPost(post_cls):  # bidirectional attention: same parameter names, sees the future
        def __init__(self, dim, heads, max_tokens, expansion=4):
            super().__init__(dim, heads, max_tokens, expansion)
            self.attn = tinytf.MultiHeadAttention(dim, heads)

    class BatchNormPost(post_cls):  # Pitfall.BATCH_NORM
        def __init__(self, dim, heads, max_tokens, expansion=4):
            super().__init__(dim, heads, max_tokens, expansion)
            self.norm1, self.norm2 = _BatchNormLast(dim), _BatchNormLast(dim)

    def quick_curve(block_factory, *, steps, lr, seed):  # a correct-looking stand-in: keeps block checks fast
        return {"loss": [2.7] * steps, "grad_norm": [1.0] * steps}

    def variant(**fns):
        return ex04.diagnose({**ns, "train_curve": quick_curve, **fns})

    assert "computes the pre-norm layout" in _titles(variant(PostNormBlock=PostIsPre))
    assert "computes the post-norm layout" in _titles(variant(PreNormBlock=PreIsPost))
    assert Pitfall.CAUSAL_OFF_BY_ONE in _pitfalls(variant(PostNormBlock=LeakyPost))
    bn = variant(PostNormBlock=BatchNormPost)
    assert Pitfall.BATCH_NORM in _pitfalls(bn) and "parameter names" in _titles(bn)

    class ReluPre(pre_cls):  # a wrong PreNormBlock.__init__ ...
        def __init__(self, dim, heads, max_tokens, expansion=4):
            super().__init__(dim, heads, max_tokens, expansion)
            self.ffn[1] = nn.ReLU()

    class PostOnReluPre(ReluPre):  # ... inherited by a right PostNormBlock
        forward = post_cls.forward

    inherited = _titles(variant(PreNormBlock=ReluPre, PostNormBlock=PostOnReluPre))
    assert "PreNormBlock: the feed-forward net uses ReLU, not GELU" in inherited, inherited
    assert "PostNormBlock" not in inherited and "ex04_post" not in inherited, inherited
    assert ReluPre.__init__ is not ex04.reference_init, "the student's __init__ is restored"

    train = ns["train_curve"]

    calls = itertools.count(1)

    def unseeded(block_factory, *, steps, lr, seed):  # ignores its seed: each call trains from another one
        return train(block_factory, steps=steps, lr=lr, seed=seed + next(calls))

    assert "not reproducible" in _titles(variant(train_curve=unseeded))
    assert "wrong structure" in _titles(variant(train_curve=lambda block_factory, *, steps, lr, seed: [1.0] * steps))


class _BatchNormLast(nn.Module):
    """BatchNorm over the feature axis of [B, T, D]: statistics across the batch (Pitfall.BATCH_NORM)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x.transpose(1, 2)).transpose(1, 2)


# ---- the corpus: hidden tests, judges and the self-check agree ------------------------------------

CORPUS = REPO / "tests" / "corpus"
CASES = [(ex, path.stem) for ex in sorted(NOTEBOOKS) for path in sorted((CORPUS / ex).glob("*.json"))]


def test_every_exercise_has_corpus_cases():
    assert {ex: sum(e == ex for e, _ in CASES) >= 3 for ex in NOTEBOOKS} == dict.fromkeys(NOTEBOOKS, True)


@pytest.mark.parametrize("ex,case", CASES)
def test_corpus_hidden_tests_judges_and_self_check_agree(ex, case, tmp_path, monkeypatch, fake_clock):
    """For every corpus case: a graded cell passes (visible + hidden tests) exactly when its judge accepts
    what it recorded, the points match the case's expected score, and ``diagnose`` names the case's pitfalls."""
    spec = json.loads((CORPUS / ex / f"{case}.json").read_text(encoding="utf-8"))
    assert spec["exercise"] == ex and {"about", "cells", "validate", "grade"} <= set(spec)
    torch.manual_seed(0)
    failures: dict[str, str | None] = {}
    ns = _run_notebook(ex, tmp_path, monkeypatch, sources=spec["cells"], failures=failures)
    points = {_grade(c)["grade_id"]: _grade(c)["points"] for c in _grade_cells(ex)}
    passed = {gid: failures[gid] is None for gid in points}
    records = load_records(tmp_path)
    for gid, ok in passed.items():
        judged = gid in records and judges.run_judge(gid, records[gid]["value"], records[gid]["inputs"])[0]
        assert ok == judged, f"{case}: {gid}: the hidden tests say {ok}, the judge says {judged}"
    assert sum(points[gid] for gid, ok in passed.items() if ok) == spec["grade"]["score"], (case, passed)
    assert sum(points.values()) == spec["grade"]["max_score"]
    findings = {"ex01": ex01, "ex02": ex02, "ex03": ex03, "ex04": ex04}[ex].diagnose(ns)
    assert (not findings) == spec["validate"]["clean"], _titles(findings)
    assert {p.name for p in _pitfalls(findings)} >= set(spec["validate"]["pitfalls"]), _titles(findings)
    text = " ".join(f"{f.title} {f.message}" for f in findings)
    assert all(s in text for s in spec["validate"]["says"]), text
