"""papermill_run.py, the executor behind build/executed/: papermill's run with the parameters injected, exit 1
on a failing cell with the partial notebook written, and without jsonschema's slow rfc3987_syntax import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat

from tinytf.course import papermill_run

SCRIPT = Path(papermill_run.__file__)
# main() as the script runs it, then whether jsonschema's rfc3987_syntax stayed unimported (None: "import fails")
DRIVER = ("import runpy, sys; run = runpy.run_path(sys.argv[1], run_name='papermill_run'); code = run['main'](sys.argv[2:]); "
          "print('SKIPPED', sys.modules.get('rfc3987_syntax', 'absent') is None); sys.exit(code)")


def _notebook(path: Path, *sources: str) -> Path:
    params = nbformat.v4.new_code_cell('device = "auto"')
    params.metadata["tags"] = ["parameters"]
    nb = nbformat.v4.new_notebook(cells=[params, *map(nbformat.v4.new_code_cell, sources)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def _run(src: Path, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TINYTF_KERNEL_ZYGOTE": "off"}  # a plain kernel: the forked one is tests/test_kernels.py's
    return subprocess.run([sys.executable, "-c", DRIVER, str(SCRIPT), str(src), str(out), str(src.parent), "cpu", "python3", "60"],
                          env=env, capture_output=True, text=True, timeout=300)


def _stdout(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "".join("".join(o.get("text", "")) for c in cells for o in c.get("outputs", []) if o.get("name") == "stdout")


def test_runs_with_the_device_injected_and_without_rfc3987(tmp_path):
    src = _notebook(tmp_path / "ok.ipynb", "print('device is', device)")
    run = _run(src, tmp_path / "ok.out.ipynb")
    assert run.returncode == 0, run.stderr[-2000:]
    assert _stdout(tmp_path / "ok.out.ipynb") == "device is cpu\n"
    assert "SKIPPED True" in run.stdout, "papermill_run must keep jsonschema from compiling rfc3987_syntax's grammars"


def test_a_failing_cell_exits_1_with_the_partial_notebook_written(tmp_path):
    src = _notebook(tmp_path / "bad.ipynb", "print('before')", "raise ValueError('boom')", "print('after')")
    run = _run(src, tmp_path / "bad.out.ipynb")
    assert run.returncode == 1 and "boom" in run.stderr, run.stderr[-2000:]
    assert _stdout(tmp_path / "bad.out.ipynb") == "before\n", "the cells up to the error ran, the one after it did not"
