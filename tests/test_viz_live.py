"""Every live widget runs to the end under papermill on a busy machine (no widget front end, no TINYTF_HEADLESS).

papermill (nbclient) has no browser: a widget's live path must not wait for one, nor depend on a message
a slow kernel can lose. The test writes one notebook that builds each explorer of :mod:`tinytf.viz` live
and sets every control to each of its values (a cell per control, each ending on a redraw), and runs it
with papermill several times at once (fresh kernels competing with each other) while two busy-loop
processes keep both cores occupied. The timeout only
detects a hang (a run normally takes a fraction of it); nothing here measures speed.

The hang this guards against: the live figure used to sit in an ``ipywidgets.Output``; nbclient mimics
that widget's front end by sending a ``comm_msg`` on the *shell* socket for each output it captures,
while it is waiting on that socket for the cell's ``execute_reply`` (jupyter/nbclient#312). Under load the
two meet and the poll never wakes: the reply sits unread on the socket (seen there) and the run hangs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

import tinytf.viz

pytestmark = pytest.mark.slow

REPEATS = 3  # papermill runs at the same time, each a fresh kernel
BUSY = 2  # busy-loop processes: both cores of the reference machine taken
# per run (one normally takes a few minutes at most, even on a machine as busy as this one): the hang detector.
# No per-cell --execution-timeout: nbclient's timed poll wakes up and then finds the reply it had missed, which
# turns the hang into a silent delay of that timeout per cell instead of a failure.
RUN_TIMEOUT_S = 600

# every widget front end of tinytf.viz -> (how a chapter builds it, its controls)
EXPLORERS = {
    "attention_explorer": ('attention_explorer("the cat sat on the mat", mask="both", heads=2)',
                           ["sentence", "tokenizer", "mask", "scaling", "temperature", "heads", "head"]),
    "memory_explorer": ("memory_explorer(layers=4, t_max=8192)",
                        ["batch", "heads", "dim", "layers", "dtype", "mode", "attention", "capacity_gib"]),
    "cache_explorer": ("cache_explorer(layers=8)",
                       ["batch", "layers", "heads", "kv_heads", "window", "head_dim", "dtype", "reserved_gib"]),
    "online_softmax_stepper": ("online_softmax_stepper(37, T=64, block_k=8)", ["row", "step", "causal"]),
    "finite_explorer": ("finite_explorer(tokens=32)", ["scaling", "safe_softmax", "tokens"]),
    "rope_decay_explorer": ("rope_decay_explorer(base=10000.0, compare=(100.0, 500000.0))", ["base", "rotary_dim"]),
}
SENTENCES = ["猫坐在垫子上", "the cat sat", "", "w " * 30]  # Chinese, fewer tokens, empty (a message), too long

SWEEP = '''
import json

import ipywidgets

SENTENCES = {sentences!r}
RECORDS = []  # printed by the last cell: a cell that ends on a redraw is the case that used to hang


def values_of(w):
    """Each value a control offers: every option, every step of a short slider, else its ends and middle."""
    if hasattr(w, "options"):
        return [o[1] if isinstance(o, tuple) else o for o in w.options]
    if isinstance(w, ipywidgets.Checkbox):
        return [not w.value, w.value]
    if isinstance(w, ipywidgets.Text):
        return SENTENCES
    if isinstance(w, ipywidgets.FloatLogSlider):
        return [w.base ** w.min, w.base ** ((w.min + w.max) / 2), w.base ** w.max]
    if isinstance(w, ipywidgets.IntSlider) and w.max - w.min <= 12:
        return list(range(w.min, w.max + 1))
    return [w.min, (w.min + w.max) / 2 if isinstance(w.value, float) else (w.min + w.max) // 2, w.max]


def sweep(name, ui, control):
    """Set ``control`` to each of its values, then back (the last change redraws); record what was done."""
    w = ui.controls[control]
    start, changes = w.value, 0
    for v in values_of(w) + [start]:
        if v != w.value:
            w.value = v
            changes += 1
            assert ui.live.fig is not None, (name, control, v)
    RECORDS.append({{"explorer": name, "control": control, "changes": changes}})
'''


def _notebook() -> nbformat.NotebookNode:
    """Per explorer a cell building it live (just that: the first, the second cell of the run, is the case the
    issue saw hang), a cell checking it, then one cell per control (each ends on a redraw); the sweep helper
    comes after the first widget, and a last cell prints what was done."""
    cells = [nbformat.v4.new_code_cell("from tinytf.viz import " + ", ".join(EXPLORERS))]
    for k, (name, (call, controls)) in enumerate(EXPLORERS.items()):
        cells.append(nbformat.v4.new_code_cell(f"ui = {call}"))
        if k == 0:
            cells.append(nbformat.v4.new_code_cell(SWEEP.format(sentences=SENTENCES)))
        cells.append(nbformat.v4.new_code_cell(
            f"assert hasattr(ui, 'live'), 'the live widget, not the static figure'\n"
            f"RECORDS.append({{'explorer': {name!r}, 'controls': list(ui.controls)}})"))
        cells += [nbformat.v4.new_code_cell(f"sweep({name!r}, ui, {c!r})") for c in controls]
    cells.append(nbformat.v4.new_code_cell("for r in RECORDS:\n    print(json.dumps(r))"))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


@pytest.fixture
def busy_machine() -> Iterator[None]:
    """``BUSY`` processes spinning on the CPU for the duration of the test, always stopped afterwards."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(BUSY)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _papermill(source: Path, target: Path) -> subprocess.Popen:
    """Start papermill ``source`` -> ``target`` with no TINYTF_HEADLESS (and matplotlib's own backend), in its
    own process group (the kernel goes with it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TINYTF_HEADLESS", "MPLBACKEND")}
    cmd = [sys.executable, "-m", "papermill", str(source), str(target), "-k", "python3", "--cwd", str(source.parent),
           "--no-progress-bar"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _finished(proc: subprocess.Popen, deadline: float) -> tuple[int, str]:
    """``(exit status, output)`` of a papermill run; killed with its kernel when it outruns the deadline."""
    try:
        out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return -9, out + f"\n[killed after {RUN_TIMEOUT_S} s]"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _records(path: Path) -> list[dict]:
    nb = nbformat.read(path, as_version=4)
    return [json.loads(line) for cell in nb.cells for o in cell.get("outputs", []) if o.get("name") == "stdout"
            for line in o["text"].splitlines() if line.startswith("{")]


def test_the_test_covers_every_widget_front_end():
    widgets = sorted(n for n in tinytf.viz.__all__ if n.endswith(("_explorer", "_stepper")))
    assert len(widgets) == 6 and widgets == sorted(EXPLORERS)


def test_every_widget_runs_live_under_papermill_on_a_busy_machine(tmp_path, busy_machine):
    source = tmp_path / "live.ipynb"
    nbformat.write(_notebook(), source)
    targets = [tmp_path / f"live.out{k}.ipynb" for k in range(REPEATS)]
    procs = [_papermill(source, target) for target in targets]  # all at once: the kernels compete too
    deadline = time.monotonic() + RUN_TIMEOUT_S
    runs = [_finished(proc, deadline) for proc in procs]
    for repeat, ((code, out), target) in enumerate(zip(runs, targets)):
        assert code == 0, f"run {repeat}: papermill exited {code} (a hang ends in a timeout):\n{out[-3000:]}"
        records = _records(target)
        built = {r["explorer"]: r["controls"] for r in records if "controls" in r}
        assert sorted(built) == sorted(EXPLORERS)
        swept = {(r["explorer"], r["control"]): r["changes"] for r in records if "changes" in r}
        assert built == {n: controls for n, (_, controls) in EXPLORERS.items()}
        assert sorted(swept) == sorted((n, c) for n, controls in built.items() for c in controls)  # every control ...
        assert all(n >= 1 for n in swept.values()), swept  # ... changed at least once (and back)
