"""The package's layers: no module imports another module's ``_private`` name, and the import-linter
contracts in pyproject.toml (layers, model code below the course, no import loops) are kept."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from importlinter.api import read_configuration  # import-linter is in the dev extra: pip install -e ".[dev]"

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "tinytf"


def module_name(path: Path) -> str:
    """``tinytf/checks/probe.py`` -> ``tinytf.checks.probe``; a package's ``__init__.py`` is the package."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private(name: str) -> bool:
    """``_x`` (and gettext's ``_``: modules import it as ``gettext as _``) is private; ``__x__`` is not."""
    return name.startswith("_") and not name.startswith("__")


def _source_of(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` reads from."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_imports(module: str, source: str, modules: set[str], *, is_package: bool = False) -> list[str]:
    """Every place where ``module`` takes a ``_private`` name from another tinytf module: ``from m import _x``,
    or ``m._x`` on a name bound to an imported tinytf module (``import tinytf.m as m``, ``from . import m``).
    A private *module* (``from . import _front``) is a module, not a name, and is not counted."""
    tree = ast.parse(source)
    bound: dict[str, str] = {}  # local name -> the tinytf module it refers to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tinytf":
                    bound[alias.asname or "tinytf"] = alias.name if alias.asname else "tinytf"
        elif isinstance(node, ast.ImportFrom):
            src = _source_of(module, is_package, node)
            if src.split(".")[0] != "tinytf":
                continue
            for alias in node.names:
                if f"{src}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{src}.{alias.name}"
                elif _private(alias.name) and src != module:
                    found.append(f"{module}:{node.lineno} imports {alias.name} from {src}")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):  # inner links of a chain repeat its findings: the set drops them
            continue
        chain, base = [], node
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        if not (isinstance(base, ast.Name) and base.id in bound):
            continue
        current = bound[base.id]
        for attr in reversed(chain):
            if f"{current}.{attr}" in modules:
                current = f"{current}.{attr}"
                continue
            if _private(attr) and current != module:
                found.append(f"{module}:{node.lineno} reads {attr} of {current}")
            break
    return sorted(set(found))


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}


def test_the_detector_finds_both_forms_and_ignores_private_modules_and_own_names():
    modules = {"tinytf", "tinytf.a", "tinytf.b", "tinytf.pkg", "tinytf.pkg._front", "tinytf.pkg.c"}
    bad = ("from .b import _helper, public\n"
           "from tinytf.b import _other\n"
           "import tinytf.b as b\n"
           "from tinytf import b as bee\n"
           "import tinytf\n"
           "x = b._hidden + bee._also + tinytf.b._deep + tinytf.pkg.c._deeper\n")
    assert private_imports("tinytf.a", bad, modules) == [
        "tinytf.a:1 imports _helper from tinytf.b",
        "tinytf.a:2 imports _other from tinytf.b",
        "tinytf.a:6 reads _also of tinytf.b",
        "tinytf.a:6 reads _deep of tinytf.b",
        "tinytf.a:6 reads _deeper of tinytf.pkg.c",
        "tinytf.a:6 reads _hidden of tinytf.b",
    ]
    fine = ("from . import _front\n"
            "from ._front import shown\n"
            "from .c import __all__\n"
            "import torch\n"
            "from torch.utils import _pytree\n"
            "y = _front.shown + torch._C + self._cache\n")
    assert private_imports("tinytf.pkg.c2", fine, modules | {"tinytf.pkg.c2"}) == []
    # a package's own __init__ reading one of its submodules' private names counts too
    assert private_imports("tinytf.pkg", "from .c import _x\n", modules, is_package=True) == ["tinytf.pkg:1 imports _x from tinytf.pkg.c"]


def test_no_module_imports_another_modules_private_name():
    modules = package_modules()
    assert len(modules) >= 75, f"expected the whole package (75+ modules) under {PACKAGE}, found {len(modules)}"
    assert {"tinytf.config", "tinytf.checks.probe", "tinytf.course.check.validate", "tinytf.viz.tiled"} <= set(modules)
    found = [hit for name, path in sorted(modules.items())
             for hit in private_imports(name, path.read_text(encoding="utf-8"), set(modules), is_package=path.name == "__init__.py")]
    assert found == [], "a name another module needs is public (no underscore) and documented:\n" + "\n".join(found)


def test_config_imports_no_model_module():
    tree = ast.parse((PACKAGE / "config.py").read_text(encoding="utf-8"))
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level > 0]
    imported += [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names if a.name.startswith("tinytf")]
    assert set(imported) <= {"translation", "language"}, (  # the message catalog its errors speak, the only layers below it
        f"tinytf/config.py stands on nothing but the message catalog: it imports {imported}")


def test_pyproject_declares_the_four_contracts():
    config = read_configuration(str(REPO / "pyproject.toml"))
    assert config["session_options"]["root_packages"] == ["tinytf"]
    contracts = {c["id"]: c for c in config["contracts_options"]}
    assert len(contracts) == 4
    assert contracts["layers"]["type"] == "layers" and str(contracts["layers"]["exhaustive"]).lower() == "true"
    layers = contracts["layers"]["layers"]
    assert layers[0].startswith("course") and layers[-3].startswith("config") and layers[-2:] == ["translation", "language"]
    assert contracts["model-code-below-the-course"]["forbidden_modules"] == ["tinytf.course", "tinytf.viz", "tinytf.checks"]
    assert contracts["no-import-loops"]["type"] == "acyclic_siblings"
    course = contracts["course-layers"]  # the course tooling by job, every module of it in a layer
    assert course["containers"] == ["tinytf.course"] and str(course["exhaustive"]).lower() == "true"
    assert course["layers"] == ["cli", "grade | check", "build", "reference", "exercises | ipynb | messages"]


def test_lint_imports_keeps_every_contract():
    run = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()", "--no-cache"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0 and "4 kept, 0 broken" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]


def test_the_course_tooling_starts_processes_only_through_stock_apis():
    """Issue 34: every notebook runs in a stock kernel (jupyter_client / nbclient / nbgrader / papermill), pools are
    concurrent.futures with an explicit spawn context, and nothing forks a process that imported torch, runs a
    module by path, edits sys.path or overrides a Jupyter library's private method."""
    course = sorted((PACKAGE / "course").rglob("*.py"))
    assert len(course) >= 35, f"expected the course package and its reference modules, found {len(course)} files"
    forbidden = re.compile(r"os\.fork\(|os\.forkpty\(|sys\.path\[|sys\.path\.(insert|append)|def _async_\w+\(|AF_UNIX|send_fds|"
                           r"runpy\.run_(path|module)|get_context\(\"fork\"\)|spec_from_file_location\(\"tinytf")
    found = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in course
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if forbidden.search(line)]
    assert found == [], "home-made process machinery in tinytf/course:\n" + "\n".join(found)
    pools = [(p, line) for p in course for line in p.read_text(encoding="utf-8").splitlines() if "ProcessPoolExecutor(" in line]
    assert len(pools) >= 2 and all("mp_context=" in line for _, line in pools), pools  # grading and the executed chapters
    mains = sorted(str(p.relative_to(PACKAGE / "course")) for p in course if 'if __name__ == "__main__"' in p.read_text(encoding="utf-8"))
    assert mains == ["build/book.py", "build/executed.py", "cli.py"], f"run with python -m, never by path: {mains}"
