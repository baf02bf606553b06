"""`make bench`: what ``tinytf grade`` costs per notebook, against the notebook's own run time.

Builds STUDENTS correct submissions of every exercise (the released notebook with the solution
regions filled in), then measures

* ``own_s``: each notebook executed once, directly, with nbclient in a fresh kernel (a new
  interpreter, kernel start included, as a student's JupyterLab runs it) — the notebook's own run;
* ``grade``: one ``tinytf.course.grade.run.grade`` run over all of them with ``--jobs JOBS`` and the kernels in
  the bubblewrap sandbox: wall time, the time per notebook (wall x jobs / notebooks) and, from nbclient's cell
  timing metadata, the cells themselves;
* ``grade_unsandboxed``: the same run with ``sandbox="none"`` (the limits only): the sandbox's own cost;
* ``nbgrader``: the anchor an instructor would otherwise use — ``nbgrader autograde EX --force``
  (nbgrader's own command line, one exercise at a time, every student) on the same notebooks in a
  copy of the same course root: one notebook after another, no limits, no clean-process judging
  and no feedback pages; its time per notebook is wall / notebooks.

``--cold`` clears the cached course roots first, so ``grade`` builds them (a one-time cost per
version of the solutions, which a class of hundreds of submissions does not notice).

Writes build/bench/grading.json with the conditions (CPU count, load average, jobs). Timings on a
shared machine are noisy: compare runs made under the same load.

    python benchmarks/grading.py [--students 2] [--jobs 2] [--exercises ex01 ex02 ...] [--cold] [--skip-nbgrader]
                                 [--out build/bench]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the notebook surgery helpers of the course tests

import _coursekit as K  # noqa: E402

from tinytf.course.build.nbgrader_root import CACHE, cached_course_root  # noqa: E402
from tinytf.course.exercises import find_notebooks  # noqa: E402
from tinytf.course.grade.run import grade  # noqa: E402
from tinytf.course.grade.sandbox import bwrap_works  # noqa: E402
from tinytf.course.ipynb import kernel_config  # noqa: E402


def build_submissions(dest: Path, students: int, exercises: list[str] | None) -> dict[str, Path]:
    """``dest/sNN/<exercise>.ipynb`` for ``students`` students; returns ``{exercise: one submission}``."""
    sols = find_notebooks(REPO / "solutions", exercises)
    rels = find_notebooks(REPO / "exercises", exercises)
    one = {}
    for ex, sol in sols.items():
        nb = K.solved(K.load(rels[ex]), K.load(sol))
        for s in range(students):
            one[ex] = K.save(nb, dest / f"s{s:02d}" / sol.name)
    return one


def own_run_seconds(path: Path) -> float:
    """Seconds to execute ``path`` with nbclient in a fresh kernel (start included), as JupyterLab runs it."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True, config=kernel_config(),
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return time.perf_counter() - start


def _cells_seconds(nb: dict) -> float:
    """First cell start to last cell end, from nbclient's ``metadata.execution`` timestamps."""
    stamps = []
    for cell in nb.get("cells", []):
        ex = cell.get("metadata", {}).get("execution", {})
        for key in ("iopub.execute_input", "shell.execute_reply"):
            if key in ex:
                stamps.append(datetime.fromisoformat(ex[key].replace("Z", "+00:00")).timestamp())
    return max(stamps) - min(stamps) if stamps else 0.0


def grade_run(subs: Path, out: Path, jobs: int, exercises: list[str] | None, sandbox: str) -> dict:
    """One ``grade()`` run; the cells' own time read from the autograded notebooks it kept."""
    work_root = Path(tempfile.mkdtemp(prefix="tinytf-bench-"))
    os.environ["TMPDIR"] = str(work_root)
    tempfile.tempdir = None
    try:
        start = time.perf_counter()
        results = grade(subs, out, exercises=exercises, jobs=jobs, progress=False, keep_work=True, sandbox=sandbox)
        wall = time.perf_counter() - start
    finally:
        tempfile.tempdir = None
    graded = sorted(work_root.glob("tinytf-grade-*/jobs/*/autograded/*/*/*.ipynb"))
    cells = [_cells_seconds(json.loads(p.read_text(encoding="utf-8"))) for p in graded]
    shutil.rmtree(work_root, ignore_errors=True)
    n = len(results)
    return {"sandbox": sandbox, "notebooks": n, "wall_s": round(wall, 2), "per_notebook_s": round(wall * jobs / n, 2),
            "statuses": sorted({r.status for r in results}), "cells_mean_s": round(sum(cells) / max(1, len(cells)), 2)}


def nbgrader_run(subs: Path, exercises: list[str]) -> dict:
    """``nbgrader autograde EX --force`` for each exercise over every student of ``subs``."""
    import subprocess

    root = Path(tempfile.mkdtemp(prefix="tinytf-bench-nbgrader-")) / "course"
    shutil.copytree(cached_course_root(REPO / "solutions", exercises, "en", released=REPO / "exercises"), root)  # grade's own
    n = 0
    for student in sorted(p for p in subs.iterdir() if p.is_dir()):
        for nb in sorted(student.glob("ex*.ipynb")):
            dest = root / "submitted" / student.name / nb.name[:4] / nb.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(nb, dest)
            n += 1
    exe = Path(sys.executable).parent / "nbgrader"
    env = dict(os.environ, PATH=f"{exe.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    flags = [f"--CourseDirectory.root={root}", "--CourseDirectory.course_id=tinytf",
             f"--CourseDirectory.db_url=sqlite:///{root / 'gradebook.db'}", "--Execute.timeout=60",
             "--Execute.kernel_name=python3", f"--Exchange.root={root / 'exchange'}"]
    start = time.perf_counter()
    failed = [ex for ex in exercises if subprocess.run([str(exe), "autograde", ex, "--force", *flags], cwd=root, env=env,
                                                        stdin=subprocess.DEVNULL, capture_output=True).returncode != 0]
    wall = time.perf_counter() - start
    graded = len(list(root.glob("autograded/*/*/*.ipynb")))
    shutil.rmtree(root.parent, ignore_errors=True)
    return {"notebooks": n, "graded": graded, "failed_exercises": failed, "wall_s": round(wall, 2),
            "per_notebook_s": round(wall / max(1, n), 2)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--exercises", nargs="*", default=None)
    parser.add_argument("--skip-own", action="store_true", help="do not time the notebooks on their own")
    parser.add_argument("--skip-nbgrader", action="store_true", help="do not time nbgrader autograde")
    parser.add_argument("--cold", action="store_true", help="clear the cached course roots first (grade builds them)")
    parser.add_argument("--out", default="build/bench")
    args = parser.parse_args(argv)
    os.environ.update(TINYTF_HEADLESS="1", MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    tmp = Path(tempfile.mkdtemp(prefix="tinytf-bench-subs-"))
    one = build_submissions(tmp / "subs", args.students, args.exercises)
    own = {} if args.skip_own else {ex: round(own_run_seconds(p), 2) for ex, p in sorted(one.items())}
    if args.cold:
        shutil.rmtree(CACHE, ignore_errors=True)
    else:  # built before the clock starts: the one-time cost a class does not notice (--cold includes it)
        for lang, (sols, rel) in {"en": ("solutions", "exercises"), "zh": ("solutions", "exercises/zh")}.items():
            cached_course_root(REPO / sols, sorted(one), lang, released=REPO / rel)
    load_before = os.getloadavg()
    run = grade_run(tmp / "subs", tmp / "out", args.jobs, args.exercises, "bwrap" if bwrap_works() else "none")
    bare = grade_run(tmp / "subs", tmp / "out-none", args.jobs, args.exercises, "none") if run["sandbox"] == "bwrap" else None
    anchor = None if args.skip_nbgrader else nbgrader_run(tmp / "subs", sorted(one))
    shutil.rmtree(tmp, ignore_errors=True)
    own_mean = sum(own.values()) / len(own) if own else None
    report = {"conditions": {"cpus": os.cpu_count(), "loadavg_start": load_before, "loadavg_end": os.getloadavg(), "jobs": args.jobs,
                             "students": args.students, "exercises": sorted(one), "cold_course_roots": args.cold,
                             "python": sys.version.split()[0]},
              "own_s": own, "own_mean_s": own_mean and round(own_mean, 2), "grade": run, "grade_unsandboxed": bare,
              "nbgrader": anchor}
    if bare:
        report["sandbox_cost"] = round(run["per_notebook_s"] / bare["per_notebook_s"], 2)
    if own_mean:
        report["grade_over_own"] = round(run["per_notebook_s"] / own_mean, 2)
        if anchor:
            report["nbgrader_over_own"] = round(anchor["per_notebook_s"] / own_mean, 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grading.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"{run['notebooks']} notebooks, jobs={args.jobs}, sandbox {run['sandbox']}: wall {run['wall_s']} s, "
          f"{run['per_notebook_s']} s per notebook (cells {run['cells_mean_s']} s; own run {report['own_mean_s']} s); "
          f"statuses {run['statuses']}; load {os.getloadavg()[0]:.1f}")
    if bare:
        print(f"without the sandbox: {bare['per_notebook_s']} s per notebook: the sandbox costs {report['sandbox_cost']}x")
    if anchor:
        print(f"nbgrader autograde: {anchor['per_notebook_s']} s per notebook ({anchor['graded']}/{anchor['notebooks']} graded)")
    if own_mean:
        print(f"per notebook over its own run: tinytf grade {report['grade_over_own']}x"
              + (f", nbgrader autograde {report['nbgrader_over_own']}x" if anchor else ""))
    return report


if __name__ == "__main__":
    main()
