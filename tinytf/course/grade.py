"""``tinytf grade SUBMISSIONS``: a gradebook from a folder of student notebooks, whatever they contain.

Layout: ``SUBMISSIONS/<student>/<exNN_name>.ipynb`` (nbgrader's collected layout
``SUBMISSIONS/<student>/<exNN>/<exNN_name>.ipynb`` works too). One course root per edition, built
from the solutions once and cached under ``build/course-roots/`` until a solution, a released copy or
tinytf's source changes (:func:`tinytf.course.nbgrader_root.cached_course_root`); then for every
student and exercise:

1. *Sandbox* (student code runs here): a private nbgrader course root (a copy of the run's gradebook
   db and the source notebook) and ``nbgrader autograde`` of that one submission
   (:mod:`tinytf.course.autograde_job`) in its own process, forked by a
   :class:`tinytf.course.sandbox.ForkServer` (nbgrader imported once per worker, never a process that
   ran a job) — per-cell timeout (nbgrader's ``Execute.timeout``), a whole-notebook wall limit,
   ``RLIMIT_AS`` per process, everything killed at the end (:func:`tinytf.course.sandbox.run_limited`'s
   limits). Hidden tests call ``record(...)`` into the job's ``TINYTF_RECORD_DIR``.
2. *Finish* (no student code): ``jobs`` clean ``python -I -m tinytf.course.finish`` processes
   (:mod:`tinytf.course.finishers`) judge every test cell and write the feedback pages
   (:mod:`tinytf.course.finish`); each job goes to them on stdin as soon as its sandbox has ended.
3. The parent writes the gradebook (:mod:`tinytf.course.gradebook`): ``grades.csv``,
   ``grades_per_cell.csv``, ``feedback/<student>/<exercise>.html`` and ``summary.txt``.

``shard=(K, N)`` grades only the students of shard K of N (:mod:`tinytf.course.shard`); ``tinytf
gradebook merge`` joins the shards' gradebooks into the one a single run would write.
Submissions are only ever read (copied into the job folder).
"""

from __future__ import annotations

import json
import queue
import shutil
import sys
import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from tinytf.language import edition_of

from .feedback import sanitize_for_feedback
from .finish import CellSpec, classify_test_cell, grade_specs
from .finishers import Finishers
from .finishers import finish_all as _finish_all  # looked up here at call time: benchmarks/grading.py wraps it
from .gradebook import STATUSES, CellResult, ExerciseResult, aggregate, summary_text, whole, write_gradebook
from .kernels import with_zygote
from .nbgrader_root import REPO, cached_course_root, ensure_tool_path, find_notebooks, nbgrader_config
from .notebook import cells_by_id, load_json, read_notebook, write_atomic
from .sandbox import ForkServer, Limits, run_limited
from .shard import write_shard_info
from .submissions import find_submission, for_nbgrader, safe_id, student_folders

__all__ = ["STATUSES", "CellSpec", "CellResult", "ExerciseResult", "grade", "grade_specs", "classify_test_cell",
           "sanitize_for_feedback", "summary_text", "read_notebook"]

_AUTOGRADE_JOB = Path(__file__).with_name("autograde_job.py")
# what the sandbox's fork server imports once (autograde_job's imports), instead of every job
_PRELOAD = ["nbgrader.apps", "nbgrader.converters", "nbgrader.preprocessors", "nbclient", "jupyter_client.manager"]
# the steps `benchmarks/grading.py` times (module attributes it wraps)
BENCH_PHASES = ("_setup", "_sandbox_one", "_finish_all")


@dataclass
class _Context:
    courses: dict[str, Path]  # edition -> the run's course root built from that edition's solutions
    work: Path
    names: dict[str, str]
    specs: dict[str, list[CellSpec]]
    cell_timeout: int
    limits: Limits
    env: dict[str, str]
    judge_files: list[str]
    known_ids: dict[str, set[str]]
    servers: queue.Queue | None = None  # ForkServers, one per worker (None: a fresh interpreter per job)


def _whole(ctx: _Context, ex: str, student: str, status: str, message: str) -> ExerciseResult:
    return whole(ex, student, [(s.grade_id, s.points) for s in ctx.specs[ex]], status, message)


def _make_job(ctx: _Context, student: str, ex: str, sub: Path, nb: dict, lang: str) -> tuple[Path, Path]:
    """The job's private course root, from the course root of the submission's edition ``lang`` (and,
    outside it, the pristine submission and nbgrader's config)."""
    name, course = ctx.names[ex], ctx.courses[lang]
    job = ctx.work / "jobs" / f"{student}__{ex}"
    shutil.rmtree(job, ignore_errors=True)
    (job / "source" / ex).mkdir(parents=True)
    shutil.copyfile(course / "gradebook.db", job / "gradebook.db")
    shutil.copyfile(course / "source" / ex / name, job / "source" / ex / name)
    (job / "submitted" / student / ex).mkdir(parents=True)
    pristine = job.parent / f"{student}__{ex}.submitted.ipynb"  # outside the sandbox's root
    shutil.copyfile(sub, pristine)
    write_atomic(job / "submitted" / student / ex / name, json.dumps(for_nbgrader(nb, ctx.known_ids[ex])))
    (job / "records").mkdir()
    config = nbgrader_config(job, timeout=ctx.cell_timeout, edition=lang)
    write_atomic(job.parent / f"{student}__{ex}.nbgrader.json", json.dumps(config))
    return job, pristine


def _sandbox_one(ctx: _Context, student: str, student_dir: Path, ex: str) -> ExerciseResult | dict:
    """Run one submission in the sandbox; an ExerciseResult when nothing needs judging, else a job item."""
    name = ctx.names[ex]
    sub = find_submission(student_dir, ex, name)
    if sub is None:
        return _whole(ctx, ex, student, "missing-submission", f"no {name} in the submission folder")
    try:
        nb = read_notebook(sub)
    except ValueError as err:
        return _whole(ctx, ex, student, "unreadable", f"{sub.name}: {err}")
    display, student = student, safe_id(student)  # nbgrader and the paths get a safe id; the CSVs the folder name
    lang = edition_of(nb) if edition_of(nb) in ctx.courses else "en"  # graded against its own edition's source
    job, pristine = _make_job(ctx, student, ex, sub, nb, lang)
    env = dict(ctx.env, TINYTF_RECORD_DIR=str(job / "records"), IPYTHONDIR=str(job / ".ipython"), TINYTF_LANG=lang)
    cmd = [sys.executable, str(_AUTOGRADE_JOB), str(job.parent / f"{student}__{ex}.nbgrader.json"), ex, student,
           str(job / "autograde.json")]
    if ctx.servers is None:
        run = run_limited(cmd, ctx.limits, cwd=job, env=env, log=job / "autograde.log")
    else:
        server = ctx.servers.get()
        try:
            run = server.run(cmd, ctx.limits, cwd=job, env=env, log=job / "autograde.log")
        finally:
            ctx.servers.put(server)
    write_atomic(job / "sandbox.json", json.dumps({"timed_out": run.timed_out, "returncode": run.returncode,
                                                   "seconds": run.seconds, "limit": ctx.limits.timeout}))
    if run.timed_out:
        (job / "autograde.json").unlink(missing_ok=True)  # whatever it wrote is not trusted
    return {"job": str(job), "exercise": ex, "student": student, "display": display, "name": name, "submission": str(pristine),
            "edition": lang, "course": str(ctx.courses[lang])}


def _collect(ctx: _Context, item: dict) -> ExerciseResult:
    ex, student = item["exercise"], item.get("display", item["student"])
    path = Path(item["job"]) / "result.json"
    payload = load_json(path) if path.exists() else {"error": "the judging process did not finish"}
    if "error" in payload:
        res = _whole(ctx, ex, student, "error", "grader error while judging: " + payload["error"])
    else:
        cells = [CellResult(**dict(c, student=student)) for c in payload["cells"]]
        res = aggregate(student, ex, cells, payload["note"])
        res.feedback = payload["feedback"]
    res.edition = item.get("edition", "en")
    return res


def _base_env() -> dict[str, str]:
    import os

    ensure_tool_path()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TINYTF_RECORD", "JPY_", "JUPYTER_"))}
    env.update(TINYTF_HEADLESS="1", MPLBACKEND="Agg", TINYTF_DEVICE="cpu", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", MALLOC_ARENA_MAX="2", PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0",
               PYDEVD_DISABLE_FILE_VALIDATION="1")
    return env


def _setup(solutions: Path, sols: dict[str, dict[str, Path]], work: Path, released: str | Path | None
           ) -> tuple[dict[str, Path], dict[str, str], dict, dict]:
    """The run's course roots, one per edition (``sols``: edition -> {exercise: solution}), built once
    and cached (:func:`tinytf.course.nbgrader_root.cached_course_root`), and the graded cells (the
    same in both editions: the twin tests keep them so)."""
    courses: dict[str, Path] = {}
    for lang, found in sols.items():
        rel = (Path(released) / "zh" if lang == "zh" else Path(released)) if released else None
        try:
            courses[lang] = cached_course_root(solutions, sorted(found), lang, released=rel)
        except OSError:  # build/ not writable (an installed tinytf): a root for this run only
            courses[lang] = cached_course_root(solutions, sorted(found), lang, released=rel, cache=work / "course-roots")
    names = {ex: p.name for ex, p in sols["en"].items()}  # the same file names in every edition
    notebooks = {ex: load_json(p) for ex, p in sols["en"].items()}
    specs = {ex: grade_specs(nb) for ex, nb in notebooks.items()}
    known = {ex: set(cells_by_id(nb)) for ex, nb in notebooks.items()}
    return courses, names, specs, known


def _editions(solutions: Path, exercises: Iterable[str] | None) -> dict[str, dict[str, Path]]:
    """The solutions of every edition: ``{"en": {exercise: path}}`` and, where ``solutions/zh/`` has
    the Chinese twins, ``"zh"`` too (a Chinese submission is graded against them)."""
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


def _run_all(ctx: _Context, students: list[Path], exercises: list[str], jobs: int, progress: bool) -> list[ExerciseResult]:
    """Every (student, exercise): the sandboxes ``jobs`` at a time, each judged as soon as it has ended
    by the judging processes (started at once, at a lower priority: they import while the first kernels run)."""
    from tqdm.auto import tqdm

    tasks = [(s.name, s, ex) for s in students for ex in exercises]
    results: list[ExerciseResult] = []
    pending: list[dict] = []
    finishers = Finishers(ctx.courses["en"], ctx.work, ctx.env, ctx.judge_files, jobs)
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(_sandbox_one, ctx, *t): t for t in tasks}
            bar = tqdm(total=len(tasks), desc="grading", unit="notebook", disable=not progress)
            for fut in as_completed(futures):
                student, _, ex = futures[fut]
                try:
                    got = fut.result()
                except Exception as err:  # noqa: BLE001 - the run finishes whatever happens
                    got = _whole(ctx, ex, student, "error", f"grader error: {type(err).__name__}: {err}"[:300])
                if isinstance(got, ExerciseResult):
                    results.append(got)
                else:
                    pending.append(got)
                    finishers.send(got)
                bar.update(1)
            bar.close()
    finally:
        _finish_all(finishers)
    return results + [_collect(ctx, item) for item in pending]


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
    keep_work: bool = False,
    progress: bool = True,
) -> list[ExerciseResult]:
    """Grade every ``SUBMISSIONS/<student>/`` on every exercise; write the gradebook to ``out``.

    ``timeout``: seconds per cell; ``notebook_timeout``: seconds per notebook (default
    ``max(120, 4 * timeout)``); ``memory_mb``: address-space limit of each grading process.
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
    editions = _editions(Path(solutions), exercises)
    sols = editions["en"]
    students = student_folders(submissions, shard)
    work = Path(tempfile.mkdtemp(prefix="tinytf-grade-"))
    servers: list[ForkServer] = []
    try:
        env, jobs = with_zygote(_base_env()), max(1, int(jobs))  # every job's kernel forks from that zygote
        servers = [ForkServer(_PRELOAD, env) for _ in range(min(jobs, len(students) * len(sols)))]  # importing meanwhile
        courses, names, specs, known = _setup(Path(solutions), editions, work, released)
        limit = float(notebook_timeout) if notebook_timeout else max(120.0, 4.0 * timeout)
        ctx = _Context(courses, work, names, specs, int(timeout), Limits(limit, memory_mb), env,
                       [str(Path(f).resolve()) for f in judge_files], known, queue.Queue())
        for server in servers:
            ctx.servers.put(server)
        results = _run_all(ctx, students, sorted(sols), jobs, progress)
        write_gradebook(results, out)
        if shard is not None:
            write_shard_info(out, shard, sorted(sols), [p.name for p in students])
    finally:
        for server in servers:
            server.close()
        if keep_work:
            print(f"work folder kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return sorted(results, key=lambda r: (r.student, r.exercise))
