"""``tinytf grade SUBMISSIONS``: a gradebook from a folder of student notebooks, whatever they contain.

Layout: ``SUBMISSIONS/<student>/<exNN_name>.ipynb`` (nbgrader's collected layout
``SUBMISSIONS/<student>/<exNN>/<exNN_name>.ipynb`` works too). One course root per edition, built from the
solutions once and cached under ``build/course-roots/`` until a solution, a released copy or tinytf's source
changes (:func:`tinytf.course.build.nbgrader_root.cached_course_root`). Then, for every student and exercise:

1. this process copies the submission into a private course root of its own (:func:`_make_job`);
2. a worker of a :class:`concurrent.futures.ProcessPoolExecutor` (``jobs`` workers, started by ``spawn``: fresh
   interpreters that import nbgrader, torch and the judges once, and never run student code) grades it:
   ``nbgrader autograde`` with the notebook's kernel in the sandbox (:func:`tinytf.course.grade.sandbox.autograde`),
   then the verdict on each test cell and the feedback page (:func:`tinytf.course.grade.verdict.verdict`);
   the result comes back as the future's value;
3. this process writes the gradebook (:mod:`tinytf.course.grade.gradebook`): ``grades.csv``,
   ``grades_per_cell.csv``, ``feedback/<student>/<exercise>.html`` and ``summary.txt``.

``shard=(K, N)`` grades only shard K of N of the students (:mod:`tinytf.course.grade.students`). Submissions are
only ever read.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from tinytf.language import edition_of

from ..build.nbgrader_root import cached_course_root, ensure_tool_path, nbgrader_config
from ..exercises import REPO, find_notebooks
from ..ipynb import cells_by_id, load_json, read_notebook, skip_slow_imports, write_atomic
from .gradebook import ExerciseResult, summary_text, whole, write_gradebook
from .sandbox import Job, Limits, autograde, sandbox_mode
from .students import find_submission, for_nbgrader, safe_id, student_folders, write_shard_info
from .verdict import CellSpec, grade_specs, verdict

__all__ = ["grade", "grade_one", "summary_text"]


@dataclass
class _Run:
    """What every job of a run shares."""

    courses: dict[str, Path]  # edition -> the run's course root built from that edition's solutions
    work: Path
    names: dict[str, str]  # exercise -> notebook file name (the same in every edition)
    specs: dict[str, list[CellSpec]]
    cell_timeout: int
    limits: Limits
    mode: str  # the sandbox: "bwrap" or "none"


def _whole(run: _Run, ex: str, student: str, status: str, message: str, edition: str = "") -> ExerciseResult:
    result = whole(ex, student, [(s.grade_id, s.points) for s in run.specs[ex]], status, message)
    result.edition = edition
    return result


def _make_job(run: _Run, number: int, student_dir: Path, ex: str) -> Job | ExerciseResult:
    """The job of ``student_dir``'s submission of ``ex`` in a private course root built from the course root of
    its edition; an ExerciseResult instead when there is nothing to run (missing, unreadable)."""
    name, display = run.names[ex], student_dir.name
    sub = find_submission(student_dir, ex, name)
    if sub is None:
        return _whole(run, ex, display, "missing-submission", f"no {name} in the submission folder")
    try:
        nb = read_notebook(sub)
    except ValueError as err:
        return _whole(run, ex, display, "unreadable", f"{sub.name}: {err}")
    student = safe_id(display)  # nbgrader and the paths get a safe id; the CSVs the folder name
    lang = edition_of(nb) if edition_of(nb) in run.courses else "en"  # graded against its own edition's source
    course, root = run.courses[lang], run.work / "jobs" / f"j{number:05d}"  # short: the kernel's sockets live beside it
    (root / "source" / ex).mkdir(parents=True)
    shutil.copyfile(course / "gradebook.db", root / "gradebook.db")
    shutil.copyfile(course / "source" / ex / name, root / "source" / ex / name)
    for support in (course / "source" / ex).iterdir():  # the assignment's other files (the zh matplotlibrc)
        if support.is_file() and support.name != name:
            shutil.copyfile(support, root / "source" / ex / support.name)
    known = set(cells_by_id(load_json(course / "source" / ex / name)))
    write_atomic(root / "submitted" / student / ex / name, json.dumps(for_nbgrader(nb, known)))
    pristine = root.parent / f"{root.name}.submitted.ipynb"  # outside the course root
    shutil.copyfile(sub, pristine)
    config = nbgrader_config(root, timeout=run.cell_timeout, edition=lang)
    return Job(root, ex, student, display, name, lang, pristine, course, config, run.limits, run.mode)


def grade_one(job: Job) -> ExerciseResult:
    """Grade one job (in a worker of the pool): nbgrader in the sandbox, then the verdict and the feedback page."""
    return verdict(job, autograde(job))


def _worker_start(env: dict[str, str], judge_files: list[str]) -> None:
    """A grading worker's start: the kernels' environment, then what every job needs, imported once."""
    os.environ.clear()
    os.environ.update(env)
    skip_slow_imports()
    import nbgrader.apps  # noqa: F401 - imported once here instead of in every job

    from ..reference.judging import load_all

    load_all()
    for i, path in enumerate(judge_files):  # an instructor's extra judges (registered on import)
        spec = importlib.util.spec_from_file_location(f"_tinytf_extra_judges_{i}", path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    # kept for the worker's life: the collector and the exit's clean-up skip it (the exit took 0.75 s, now 0.11 s)
    gc.freeze()


def _kernel_env() -> dict[str, str]:
    """The environment of the grading workers and the kernels they start: headless, the CPU, one thread each."""
    ensure_tool_path()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TINYTF_RECORD", "JPY_", "JUPYTER_"))}
    env.update(TINYTF_HEADLESS="1", MPLBACKEND="Agg", TINYTF_DEVICE="cpu", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", MALLOC_ARENA_MAX="2", PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0",
               PYDEVD_DISABLE_FILE_VALIDATION="1", TINYTF_LANG="en")
    return env


def _setup(solutions: Path, sols: dict[str, dict[str, Path]], work: Path, released: str | Path | None
           ) -> tuple[dict[str, Path], dict[str, str], dict[str, list[CellSpec]]]:
    """The run's course roots, one per edition (``sols``: edition -> {exercise: solution}), built once and
    cached, the notebooks' names and the graded cells (the same in both editions: the twin tests keep them so)."""
    courses: dict[str, Path] = {}
    for lang, found in sols.items():
        rel = (Path(released) / "zh" if lang == "zh" else Path(released)) if released else None
        try:
            courses[lang] = cached_course_root(solutions, sorted(found), lang, released=rel)
        except OSError:  # build/ not writable (an installed tinytf): a root for this run only
            courses[lang] = cached_course_root(solutions, sorted(found), lang, released=rel, cache=work / "course-roots")
    names = {ex: p.name for ex, p in sols["en"].items()}
    specs = {ex: grade_specs(load_json(p)) for ex, p in sols["en"].items()}
    return courses, names, specs


def _editions(solutions: Path, exercises: Iterable[str] | None) -> dict[str, dict[str, Path]]:
    """The solutions of every edition: ``{"en": {exercise: path}}`` and, where ``solutions/zh/`` has the
    Chinese twins, ``"zh"`` too (a Chinese submission is graded against them)."""
    sols = find_notebooks(solutions, exercises)
    if not sols:
        raise FileNotFoundError(f"no exNN_*.ipynb in {solutions}")
    editions = {"en": sols}
    if (solutions / "zh").is_dir():
        try:
            editions["zh"] = find_notebooks(solutions / "zh", sorted(sols))
        except FileNotFoundError as err:
            print(f"tinytf grade: Chinese submissions are graded as English ones: {err}", file=sys.stderr)
    return editions


def _run_all(run: _Run, jobs: list[Job], workers: int, judge_files: list[str], progress: bool) -> list[ExerciseResult]:
    """Every job in a pool of ``workers``; a job whose worker died (the pool breaks) is graded again in a fresh
    pool, once, before it counts as a grader error."""
    from tqdm.auto import tqdm

    results: list[ExerciseResult] = []
    bar = tqdm(total=len(jobs), desc="grading", unit="notebook", disable=not progress)
    for attempt in (1, 2):
        broken: list[Job] = []
        with ProcessPoolExecutor(max_workers=min(workers, max(1, len(jobs))), mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_worker_start, initargs=(_kernel_env(), judge_files)) as pool:
            futures: dict[Future, Job] = {pool.submit(grade_one, job): job for job in jobs}
            for fut in as_completed(futures):
                job = futures[fut]
                try:
                    results.append(fut.result())
                except BrokenProcessPool:
                    if attempt == 1:
                        broken.append(job)
                        continue
                    results.append(_whole(run, job.exercise, job.display, "error", "grader error: the grading worker died",
                                          job.edition))
                except Exception as err:  # noqa: BLE001 - one broken job must not stop the others
                    results.append(_whole(run, job.exercise, job.display, "error", f"grader error: {type(err).__name__}: {err}"[:300],
                                          job.edition))
                bar.update(1)
        if not broken or attempt == 2:
            break
        jobs = broken
    bar.close()
    return results


def grade(
    submissions: str | Path,
    out: str | Path = REPO / "build" / "grades",
    *,
    solutions: str | Path = REPO / "solutions",
    exercises: Iterable[str] | None = None,
    jobs: int = 1,
    timeout: int = 60,
    notebook_timeout: float | None = None,
    memory_mb: int = 4096,
    released: str | Path | None = REPO / "exercises",
    judge_files: Iterable[str] = (),
    shard: tuple[int, int] | None = None,
    sandbox: str = "auto",
    keep_work: bool = False,
    progress: bool = True,
) -> list[ExerciseResult]:
    """Grade every ``SUBMISSIONS/<student>/`` on every exercise; write the gradebook to ``out``.

    ``timeout``: seconds per cell; ``notebook_timeout``: seconds per notebook (default
    ``max(120, 4 * timeout)``); ``memory_mb``: address-space limit of each kernel; ``sandbox``: ``"auto"``,
    ``"bwrap"`` or ``"none"`` (:func:`tinytf.course.grade.sandbox.sandbox_mode`).
    ``released``: the folder of student versions handed out (``exercises/``); a test cell identical to
    the one released there is not "edited" even if the instructor changed the test since.
    ``shard``: ``(K, N)`` grades only shard K of N of the students (``out`` also gets ``shard.json``).
    A class may mix editions: a submission whose ``metadata.tinytf.edition`` is ``"zh"`` is graded
    against ``solutions/zh/`` (the same hidden tests and points; its locked cells compared with the
    Chinese release in ``released/zh/``) and gets its feedback page in Chinese.
    """
    submissions, out = Path(submissions), Path(out)
    if not submissions.is_dir():
        raise FileNotFoundError(f"{submissions} is not a folder of SUBMISSIONS/<student>/<exercise>.ipynb")
    mode = sandbox_mode(sandbox)
    editions = _editions(Path(solutions), exercises)
    students = student_folders(submissions, shard)
    work = Path(tempfile.mkdtemp(prefix="tinytf-grade-"))
    try:
        courses, names, specs = _setup(Path(solutions), editions, work, released)
        limit = float(notebook_timeout) if notebook_timeout else max(120.0, 4.0 * timeout)
        run = _Run(courses, work, names, specs, int(timeout), Limits(limit, memory_mb), mode)
        made = [_make_job(run, i, s, ex) for i, (s, ex) in enumerate((s, ex) for s in students for ex in sorted(names))]
        results = [r for r in made if isinstance(r, ExerciseResult)]
        results += _run_all(run, [j for j in made if isinstance(j, Job)], max(1, int(jobs)),
                            [str(Path(f).resolve()) for f in judge_files], progress)
        write_gradebook(results, out)
        if shard is not None:
            write_shard_info(out, shard, sorted(names), [p.name for p in students])
    finally:
        if keep_work:
            print(f"work folder kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return sorted(results, key=lambda r: (r.student, r.exercise))
