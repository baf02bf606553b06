"""`make bench`: how long one control change of each workbook widget takes to redraw.

Each explorer (attention, memory, KV cache) is built live (``TINYTF_HEADLESS=0``, as in JupyterLab)
and one of its controls is set again and again, cycling through a few values; each change runs the
widget's own observer: update the figure in place (or rebuild it when the structure changes), draw
it once with Agg and encode the PNG the browser shows. Outside a kernel no message reaches a
browser, so the figures are the Python side of a redraw (what makes a slider feel slow).

For comparison, ``rebuild`` times what a change cost before in place updates: a fresh figure
from the pure function, rendered the way the inline backend shows it (``bbox_inches="tight"``).

Quoted: medians over ``--changes`` changes (after one untimed warm-up change) of wall time and of
this process's CPU time (``time.process_time``: on a shared machine wall time also counts the
wait for a core). Each widget runs in both editions (``TINYTF_LANG=en``/``zh``, as
``tinytf.language.notebook_language`` reads it; in ``zh`` the attention explorer shows a Chinese
sentence, so its tick labels are CJK glyphs). Writes build/bench/widgets.json with the conditions
and the load average before and after.

    python benchmarks/widgets.py [--changes 12] [--out build/bench] [--widgets attention ...] [--editions en zh] [--no-rebuild]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from tinytf.viz import attention, cache, memory  # noqa: E402
from tinytf.viz._front import render_png  # noqa: E402

GOAL_MS = 100.0  # per control change, on 2 CPU cores (issue 11)
SENTENCE = "the cat sat on the mat because it was warm"  # chapter 01's explorer: 10 tokens, numbers in the cells
SENTENCE_ZH = "猫坐在垫子上，因为它暖和"  # 12 character tokens (CJK tick labels), still numbers in the cells
EDITIONS = ("en", "zh")  # TINYTF_LANG, as tinytf.language.notebook_language reads it

# widget -> (explorer, its keywords, figure function, [(control, values cycled)])
WIDGETS = {
    "attention": (attention.attention_explorer, {"sentence": SENTENCE, "mask": "none", "heads": 2}, attention.attention_figure,
                  [("head", [1, 0]), ("mask", ["causal", "none"]), ("scaling", ["none", "1/sqrt(d)"])]),
    "memory": (memory.memory_explorer, {"batch": 8, "heads": 16, "dim": 1024, "layers": 24}, memory.memory_figure,
               [("layers", [12, 24]), ("batch", [16, 8]), ("capacity_gib", [24, 80])]),
    "cache": (cache.cache_explorer, {"batch": 8, "layers": 32, "heads": 32, "head_dim": 128}, cache.cache_figure,
              [("layers", [16, 32]), ("reserved_gib", [14.0, 0.0]), ("head_dim", [64, 128])]),
}


def changes(plan: list[tuple[str, list]], n: int) -> list[tuple[str, object]]:
    """``n`` control changes, taking the controls in turn, each through its values."""
    seq = [(name, v) for name, values in plan for v in values]
    return [seq[i % len(seq)] for i in range(n + 1)]  # +1: the untimed warm-up change


def timed(fn) -> tuple[float, float]:
    """(wall ms, CPU ms) of one call of ``fn``."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return (time.perf_counter() - w0) * 1e3, (time.process_time() - c0) * 1e3


def summary(times: list[tuple[float, float]]) -> dict:
    wall, cpu = [w for w, _ in times[1:]], [c for _, c in times[1:]]  # [1:]: drop the warm-up
    return {"wall_median_ms": statistics.median(wall), "cpu_median_ms": statistics.median(cpu),
            "wall_min_ms": min(wall), "wall_max_ms": max(wall), "changes": len(wall), "wall_ms": wall}


def edition_kwargs(name: str, edition: str) -> dict:
    """The widget's keywords in ``edition`` (the attention explorer gets a Chinese sentence in ``zh``)."""
    kwargs = dict(WIDGETS[name][1])
    if edition == "zh" and "sentence" in kwargs:
        kwargs["sentence"] = SENTENCE_ZH
    return kwargs


def live_changes(name: str, n: int, edition: str = "en") -> dict:
    """Time ``n`` control changes of the live widget (its observers: update or rebuild, draw, PNG)."""
    explorer, _, _, plan = WIDGETS[name]
    kwargs = edition_kwargs(name, edition)
    os.environ["TINYTF_HEADLESS"], os.environ["TINYTF_LANG"] = "0", edition
    with contextlib.redirect_stdout(io.StringIO()):  # display() outside a kernel prints reprs
        ui = explorer(**kwargs)
        controls = ui.controls
        times = []
        for control, value in changes(plan, n):
            times.append(timed(lambda control=control, value=value: setattr(controls[control], "value", value)))
    fig = ui.live.fig
    out = summary(times) | {"figures_built": ui.live.rebuilt, "png_bytes": len(render_png(fig)),
                            "figure_inches": [round(float(x), 2) for x in fig.get_size_inches()], "dpi": float(fig.dpi)}
    plt.close("all")
    return out


def rebuild_changes(name: str, n: int, edition: str = "en") -> dict:
    """The old redraw: a fresh figure per change, rendered like the inline backend (tight bbox)."""
    _, _, figure_fn, plan = WIDGETS[name]
    values = edition_kwargs(name, edition)
    os.environ["TINYTF_LANG"] = edition
    times = []
    for control, value in changes(plan, n):
        values[control] = value

        def once() -> None:
            fig = figure_fn(**values)
            fig.savefig(io.BytesIO(), format="png", bbox_inches="tight")
            plt.close(fig)

        times.append(timed(once))
    return summary(times)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=12, help="timed control changes per widget (median)")
    parser.add_argument("--out", default="build/bench")
    parser.add_argument("--widgets", nargs="+", choices=list(WIDGETS), default=list(WIDGETS))
    parser.add_argument("--editions", nargs="+", choices=EDITIONS, default=list(EDITIONS))
    parser.add_argument("--no-rebuild", action="store_true", help="skip the fresh-figure comparison (halves the run)")
    args = parser.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    load_before = os.getloadavg()
    rows = {}
    for edition in args.editions:
        for name in args.widgets:
            row = {"widget": name, "edition": edition, "controls": [c for c, _ in WIDGETS[name][3]],
                   "live": live_changes(name, args.changes, edition)}
            if not args.no_rebuild:
                row["rebuild"] = rebuild_changes(name, args.changes, edition)
            rows[f"{name}/{edition}"] = row
    import tinytf

    report = {
        "benchmark": "redraw time per control change of each widget (tinytf.viz explorers), both editions",
        "method": "live: the widget's observer (update in place or rebuild, one Agg draw, PNG); rebuild: "
                  "fresh figure + savefig(bbox_inches='tight'), the pre-update path. Medians after one warm-up change. "
                  f"Edition: TINYTF_LANG; zh: the attention explorer shows {SENTENCE_ZH!r}.",
        "conditions": {"cpu_count": os.cpu_count(), "load_average_before": load_before, "load_average": os.getloadavg(),
                       "platform": platform.platform(), "python": platform.python_version(),
                       "matplotlib": matplotlib.__version__, "backend": matplotlib.get_backend(),
                       "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "tinytf": str(Path(tinytf.__file__).parent)},
        "goal_ms": GOAL_MS,
        "widgets": rows,
        "goal_met": {k: r["live"]["cpu_median_ms"] <= GOAL_MS for k, r in rows.items()},  # CPU: least disturbed by load
    }
    (out_dir / "widgets.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))

    c = report["conditions"]
    print(f"\n{report['benchmark']}\n{c['cpu_count']} CPUs, load {load_before[0]:.2f} -> {c['load_average'][0]:.2f}, "
          f"matplotlib {c['matplotlib']}, {c['platform']}, tinytf from {c['tinytf']}")
    print(f"{'widget':<13} {'live CPU':>9} {'live wall':>10} {'rebuild CPU':>12}  figures built  goal (CPU)")
    for key, r in rows.items():
        live, old = r["live"], r.get("rebuild")
        rebuilt = f"{old['cpu_median_ms']:>9.1f} ms" if old else f"{'-':>12}"
        print(f"{key:<13} {live['cpu_median_ms']:>6.1f} ms {live['wall_median_ms']:>7.1f} ms {rebuilt}  {live['figures_built']:>13}  "
              f"{'met' if report['goal_met'][key] else 'NOT met'} (<= {GOAL_MS:g} ms)")
    print(f"medians of {args.changes} changes per widget; wrote {out_dir / 'widgets.json'}")
    return report


if __name__ == "__main__":
    main()
