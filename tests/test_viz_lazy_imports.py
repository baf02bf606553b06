"""``import tinytf`` stays light: no plotting or widget stack, no course tooling, no private torch API.

Each check runs in a fresh interpreter (this test process has imported everything already).
Import *time* is not tested (timings vary with the machine): see ``python -X importtime -c "import tinytf"``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

NEVER = ("tinytf.course", "tinytf.viz", "matplotlib", "ipywidgets", "nbgrader", "jupyter_client", "IPython", "nbformat")
PRIVATE_TORCH = ("torch.utils._python_dispatch", "torch.utils._pytree", "torch._C", "torch._dynamo", "torch._inductor")

PROBE = """
import json, sys
import torch
before = set(sys.modules)
import tinytf
new = sorted(set(sys.modules) - before)
files = {m: getattr(sys.modules[m], "__file__", None) for m in new if m.startswith("tinytf")}
print(json.dumps({"all": sorted(sys.modules), "new": new, "files": files}))
"""


def _probe() -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def _top_level_imports(path: str) -> set[str]:
    """Modules a file imports at module level (not inside functions): what importing it runs."""
    tree = ast.parse(Path(path).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_import_tinytf_pulls_in_no_plotting_widgets_or_course_tooling():
    loaded = _probe()["all"]
    assert not [m for m in loaded if m.split(".")[0] in NEVER or m.startswith(NEVER)]


def test_import_tinytf_adds_no_private_torch_module():
    # ``import torch`` itself loads some private modules (torch.utils._python_dispatch among them
    # in torch 2.x), so check what ``import tinytf`` adds on top of torch, and what its own modules import
    probe = _probe()
    assert not [m for m in probe["new"] if m.startswith(PRIVATE_TORCH)]
    eager = {mod: sorted(n for n in _top_level_imports(f) if n.startswith(PRIVATE_TORCH))
             for mod, f in probe["files"].items() if f}
    assert not {mod: names for mod, names in eager.items() if names}, "import private torch API lazily, where it is used"
    assert {"tinytf.memory", "tinytf.memory_ledger", "tinytf.memory_meters", "tinytf.bench"} <= set(probe["files"])


def test_the_private_trackers_still_work_when_used():
    import torch

    from tinytf.bench import sdpa_backend
    from tinytf.memory import PeakMemoryMeter

    x = torch.randn(32, 32)
    with PeakMemoryMeter("cpu") as meter:
        y = x @ x
    assert meter.peak == y.numel() * y.element_size()
    assert sdpa_backend(x[None, None], x[None, None], x[None, None])
