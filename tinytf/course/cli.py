"""The ``tinytf`` command line. Each course tool adds a subcommand here."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _info(args: argparse.Namespace) -> int:
    import platform

    import torch

    import tinytf

    dev = tinytf.pick_device(args.device)
    print(f"tinytf {tinytf.__version__} | torch {torch.__version__} | Python {platform.python_version()}")
    print(f"device: {dev} — {tinytf.describe_device(dev)}")
    print(f"CUDA available: {torch.cuda.is_available()}")
    return 0


def _release(args: argparse.Namespace) -> int:
    from .build.release import release, release_editions
    from .exercises import REPO

    if args.solutions is None and args.out is None:  # both editions: solutions[/zh] -> exercises[/zh]
        paths = release_editions(exercises=args.exercises or None)
    else:
        paths = release(args.solutions or REPO / "solutions", args.out or REPO / "exercises", args.exercises or None)
    for p in paths:
        print(f"released {p}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    from .check.validate import format_report, validate

    worst = 0
    for path in args.notebooks:
        report = validate(path, released_dir=args.released, timeout=args.timeout)
        print(format_report(report))
        worst = max(worst, 2 if report.fatal and not report.cells else (0 if report.ok else 1))
    return worst


def _grade(args: argparse.Namespace) -> int:
    from .grade.run import grade, summary_text
    from .grade.students import parse_shard

    try:
        shard = parse_shard(args.shard) if args.shard else None
    except ValueError as err:
        print(f"tinytf grade: {err}", file=sys.stderr)
        return 2
    try:
        results = grade(args.submissions, args.out, solutions=args.solutions, exercises=args.exercises or None, jobs=args.jobs,
                        timeout=args.timeout, notebook_timeout=args.notebook_timeout, memory_mb=args.memory_mb,
                        shard=shard, sandbox=args.sandbox, keep_work=args.keep_work, progress=not args.quiet)
    except ValueError as err:  # --sandbox bwrap where bubblewrap cannot run
        print(f"tinytf grade: {err}", file=sys.stderr)
        return 2
    if shard:
        print(f"shard {shard[0]}/{shard[1]}: {len({r.student for r in results})} students")
    print(summary_text(results), end="")
    print(f"gradebook: {args.out}/grades.csv, {args.out}/grades_per_cell.csv, feedback in {args.out}/feedback/")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from .grade.gradebook import summary_text
    from .grade.students import merge

    try:
        results = merge(args.gradebooks, args.out)
    except (ValueError, FileNotFoundError) as err:
        print(f"tinytf gradebook merge: {err}", file=sys.stderr)
        return 2
    print(summary_text(results), end="")
    print(f"merged {len(args.gradebooks)} gradebooks into {args.out}/")
    return 0


def build_parser() -> argparse.ArgumentParser:
    import tinytf

    parser = argparse.ArgumentParser(prog="tinytf", description="tinytf attention workbook: course tools")
    parser.add_argument("--version", action="version", version=f"tinytf {tinytf.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("info", help="versions and the device the notebooks will use")
    p.add_argument("--device", default=None, help="auto, cpu, cuda, cuda:N or mps (default: $TINYTF_DEVICE or auto)")
    p.set_defaults(func=_info)

    from .exercises import REPO

    ex_help = "only these exercises, e.g. ex01 ex02 (default: all)"
    p = sub.add_parser("release", help="generate exercises/ from solutions/ with nbgrader (deterministic; both editions: "
                       "solutions/zh/ -> exercises/zh/ too)")
    p.add_argument("--solutions", default=None, help="one folder of instructor sources (default: both editions)")
    p.add_argument("--out", default=None, help="where its student versions go (default: exercises/ and exercises/zh/)")
    p.add_argument("--exercises", nargs="*", help=ex_help)
    p.set_defaults(func=_release)

    p = sub.add_parser("validate", help="run an exercise notebook, its visible tests and the pitfall diagnosis")
    p.add_argument("notebooks", nargs="+", metavar="NOTEBOOK")
    p.add_argument("--released", default=None, help="folder of released exercises to compare with (default: exercises/)")
    p.add_argument("--timeout", type=int, default=60, help="seconds per cell (default 60)")
    p.set_defaults(func=_validate)

    p = sub.add_parser("grade", help="autograde SUBMISSIONS/<student>/<exercise>.ipynb into a gradebook")
    p.add_argument("submissions")
    p.add_argument("--out", default=str(REPO / "build" / "grades"), help="output folder (default build/grades)")
    p.add_argument("--jobs", type=int, default=1, help="notebooks graded in parallel")
    p.add_argument("--timeout", type=int, default=60, help="seconds per cell (default 60)")
    p.add_argument("--notebook-timeout", type=float, default=None, help="seconds per notebook (default max(120, 4 x timeout))")
    p.add_argument("--memory-mb", type=int, default=4096, help="address-space limit of each notebook's kernel (default 4096)")
    p.add_argument("--sandbox", choices=("auto", "bwrap", "none"), default="auto",
                   help="where student code runs: bwrap (bubblewrap: no network, no view of solutions/ or other students), "
                        "none (resource limits only), auto (bwrap where it works; default)")
    p.add_argument("--solutions", default=str(REPO / "solutions"))
    p.add_argument("--exercises", nargs="*", help=ex_help)
    p.add_argument("--shard", metavar="K/N", help="grade only shard K (0 … N-1) of the students; auto/N: K from "
                   "$SLURM_ARRAY_TASK_ID or $JOB_COMPLETION_INDEX (then: tinytf gradebook merge)")
    p.add_argument("--keep-work", action="store_true", help="keep the temporary course roots (debugging)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_grade)

    p = sub.add_parser("gradebook", help="work with gradebooks written by tinytf grade")
    gb = p.add_subparsers(dest="gradebook_command", metavar="ACTION", required=True)
    m = gb.add_parser("merge", help="merge the gradebooks of --shard runs into the one a single run writes")
    m.add_argument("gradebooks", nargs="+", metavar="OUT_K", help="the shards' --out folders")
    m.add_argument("--out", required=True, help="folder for the merged gradebook")
    m.set_defaults(func=_merge)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from .ipynb import skip_slow_imports

    skip_slow_imports()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
