"""environment.yml and pyproject.toml name the same packages; the console script works."""

import re
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
CONDA_TO_PIP = {"pytorch": "torch"}
NOT_PACKAGES = {"python", "pip"}


def _name(spec: str) -> str:
    return re.split(r"[<>=!~\s\[]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


def pyproject_packages() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps = data["project"]["dependencies"] + data["project"]["optional-dependencies"]["dev"]
    return {_name(d) for d in deps}


def environment_packages() -> set[str]:
    names = set()
    text = (ROOT / "environment.yml").read_text()
    for line in text.split("dependencies:", 1)[1].splitlines():
        m = re.match(r"^\s*-\s+([A-Za-z0-9_.\-]+[^#]*)", line)
        if m and not line.strip().endswith(":"):
            names.add(CONDA_TO_PIP.get(_name(m.group(1)), _name(m.group(1))))
    return names - NOT_PACKAGES


def test_environment_and_pyproject_agree():
    assert environment_packages() == pyproject_packages()


def test_environment_pins_python_311():
    assert re.search(r"^\s*-\s*python=3\.11\s*$", (ROOT / "environment.yml").read_text(), re.M)


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "tinytf", "info", "--device", "cpu"], capture_output=True, text=True, check=True)
    assert "tinytf" in out.stdout and "device: cpu" in out.stdout
