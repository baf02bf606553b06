"""``Finding`` (one diagnosed problem, named by its :class:`~tinytf.checks.catalog.Pitfall`), ``report``,
and ``relation``/``tensor_relation``: a wrong number named by how it relates to the right one."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from .catalog import Pitfall

__all__ = ["Finding", "report", "found", "relation", "tensor_relation", "shape_relation"]


@dataclass(frozen=True)
class Finding:
    """One diagnosed problem: ``pitfall`` (a :class:`Pitfall`; ``Pitfall.GENERAL`` = none of the
    named pitfalls), a short ``title`` and a ``message`` that explains the evidence and the fix.

    ``fix`` (and its Chinese ``fix_zh``) is this finding's own one-line fix, printed instead of the
    catalog's fix for ``pitfall`` where the catalog's would be wrong for what was found; empty = the
    catalog's fix is the fallback."""

    pitfall: Pitfall
    title: str
    message: str
    fix: str = ""
    fix_zh: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "pitfall", Pitfall(self.pitfall))  # a plain int from JSON becomes its name

    def __str__(self) -> str:
        tag = f"pitfall {int(self.pitfall)}" if self.pitfall else "problem"
        return f"[{tag}] {self.title}: {self.text}"

    @property
    def text(self) -> str:
        """The message, ending with this finding's own fix when it has one the message does not state yet."""
        if self.fix and " Fix: " not in self.message:
            return f"{self.message} Fix: {self.fix.replace('`', '')}."
        return self.message


def found(pitfall: Pitfall, title: str, evidence: str, *, where: str = "", fix: bool | str = True,
          fix_zh: str = "") -> Finding:
    """A finding whose message is ``evidence``, then ``where`` (the inputs that show it), then the fix:
    ``fix`` when it is a string (this finding's own, with its Chinese ``fix_zh``), else the catalog's
    one-line fix for ``pitfall`` (the single source of that wording; none with ``fix=False``)."""
    message = evidence.rstrip()
    if where:
        message += " " + where
    if isinstance(fix, str):
        return Finding(pitfall, title, message + f" Fix: {fix.replace('`', '')}.", fix=fix, fix_zh=fix_zh)
    if fix and pitfall is not Pitfall.GENERAL:
        message += f" Fix: {pitfall.fix.replace('`', '')}."
    return Finding(pitfall, title, message)


def report(findings: Iterable[Finding], *, name: str | None = None) -> str:
    """A readable summary of ``findings`` (one paragraph per finding); says so when there are none."""
    findings = list(findings)
    head = f"{name}: " if name else ""
    if not findings:
        return f"{head}OK - no problems found."
    lines = [f"{head}{len(findings)} problem{'s' if len(findings) > 1 else ''} found:"]
    for f in findings:
        tag = f.pitfall.label()
        lines.append(f"  x [{tag}] {f.title}")
        lines.append(f"      {f.text}")
    return "\n".join(lines)


def _times(r: float) -> str:
    """``r`` (a clean ratio of a wrong value to the right one) in words: "exactly half the right value"."""
    named = {2.0: "exactly twice the right value", 0.5: "exactly half the right value"}
    if r in named:
        return named[r]
    frac = Fraction(r).limit_denominator(64)
    if float(frac) == r:
        if frac.denominator == 1:
            return f"exactly {frac.numerator}× the right value"
        return f"exactly {frac.numerator}/{frac.denominator} of the right value"
    square = Fraction(r * r).limit_denominator(64)
    if math.isclose(float(square), r * r, rel_tol=1e-6):
        root = square.numerator if square.denominator == 1 else square.denominator
        return (f"exactly sqrt({root}) = {math.sqrt(root):.3g}× the right value" if square.denominator == 1
                else f"exactly 1/sqrt({root}) = 1/{math.sqrt(root):.3g} of the right value")
    return ""


def _small(f: Fraction) -> bool:
    """A ratio a student's slip makes: n, 1/n (n <= 64) or p/q with q <= 8 (3/4, 5/2, …), never 7/13."""
    return f > 0 and f.numerator <= 64 and (f.denominator <= 8 or f.numerator == 1 and f.denominator <= 64)


def _clean(r: float, tol: float) -> float | None:
    """``r`` rounded to the nearest small fraction (or its square root) when it is one within ``tol``."""
    cand = Fraction(r).limit_denominator(64)
    if _small(cand) and math.isclose(float(cand), r, rel_tol=tol):
        return float(cand)
    square = Fraction(r * r).limit_denominator(64)
    if _small(square) and math.isclose(float(square), r * r, rel_tol=2 * tol):
        return math.sqrt(float(square))
    return None


def relation(got: float, want: float, *, suspects: Mapping[str, float] | None = None,
             step: tuple[str, float] | None = None, tol: float = 1e-9) -> str:
    """How a wrong number ``got`` relates to the right one ``want``, in words; ``""`` when no clean relation.

    - one ``step`` more or less (``step = (name, size)``, default one unit, size 0: none): "one tile more than the right value";
    - a ratio ``got / want`` that one of ``suspects`` (``{what it means: ratio}``) predicts:
      "exactly half the right value: dtype_bytes=4 looks ignored";
    - else a clean ratio (×2, ÷2, 3/4, sqrt(8), …): "exactly 1/sqrt(8) = 1/2.83 of the right value".
    """
    if got == want or not want or not all(map(math.isfinite, (got, want))):
        return ""
    name, size = step or ("", 1.0)
    if size and math.isclose(abs(got - want), size, rel_tol=tol, abs_tol=tol):
        more = "more" if got > want else "less"
        return f"one {name} {more} than the right value (off by one)".replace("  ", " ")
    r = got / want
    for meaning, ratio in (suspects or {}).items():
        if ratio and math.isclose(r, ratio, rel_tol=max(tol, 1e-12)):
            return f"{_times(_clean(r, max(tol, 1e-12)) or r) or f'{r:.4g}× the right value'}: {meaning}"
    clean = _clean(r, max(tol, 1e-12))
    return _times(clean) if clean not in (None, 1.0) else ""  # 1: the same value to rounding, nothing to name


def tensor_relation(got: object, want: object, *, suspects: Mapping[str, float] | None = None) -> str:
    """:func:`relation` for tensors of one shape: when ``got`` is ``c * want`` for one number ``c`` (every
    entry scaled alike, to float32 rounding), how ``c`` relates to 1; else ``""``."""
    import torch

    if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)) or got.shape != want.shape:
        return ""
    g, w = got.detach().double().reshape(-1), want.detach().double().reshape(-1)
    if not (torch.isfinite(g).all() and torch.isfinite(w).all()) or float(w.abs().max()) == 0:
        return ""
    c = float((g @ w) / (w @ w))
    if not torch.allclose(g, c * w, rtol=1e-4, atol=1e-5 * float(w.abs().max())):
        return ""
    return relation(c, 1.0, suspects=suspects, step=("", 0.0), tol=1e-4)  # a factor, never "one more"


def shape_relation(got: Sequence[int], want: Sequence[int], names: Sequence[str] = ()) -> str:
    """Where a shape is one off in a single axis: "dim 2 (Tq) has one more (6) than it should (5)"; ``""`` otherwise
    (a shape off in several axes, e.g. transposed, is no off-by-one)."""
    offs = [(i, g, w) for i, (g, w) in enumerate(zip(got, want)) if g != w]
    if len(got) != len(want) or len(offs) != 1 or abs(offs[0][1] - offs[0][2]) != 1:
        return ""
    (i, g, w), = offs
    label = f" ({names[i]})" if i < len(names) else ""
    return f"dim {i}{label} has one {'more' if g > w else 'less'} ({g}) than it should ({w})"
