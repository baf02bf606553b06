"""``Finding`` (one diagnosed problem, named by its :class:`~tinytf.checks.catalog.Pitfall`), ``report``,
and ``relation``/``tensor_relation``: a wrong number named by how it relates to the right one."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from ..translation import gettext as _
from ..translation import ngettext
from .catalog import Pitfall

__all__ = ["Finding", "report", "found", "sentences", "fix_sentence", "split_fix", "relation", "tensor_relation", "shape_relation",
           "slice_map", "slices_relation", "difference_pattern"]


def fix_sentence(fix: str, lang: str | None = None) -> str:
    """`` Fix: <fix>.`` in ``lang`` (the running notebook's by default), backticks dropped: how a message ends."""
    return _(" Fix: {fix}.", lang).format(fix=fix.replace("`", ""))


def split_fix(message: str) -> tuple[str, str]:
    """``(evidence, fix)``: a finding's message cut where its fix sentence begins (in either language)."""
    for lang in ("en", "zh"):
        mark = _(" Fix: {fix}.", lang).split("{fix}", 1)[0]
        if mark in message:
            evidence, fix = message.split(mark, 1)
            return evidence, fix
    return message, ""


@dataclass(frozen=True)
class Finding:
    """One diagnosed problem: ``pitfall`` (a :class:`Pitfall`; ``Pitfall.GENERAL`` = none of the
    named pitfalls), a short ``title`` and a ``message`` that explains the evidence and the fix.

    ``fix`` is this finding's own one-line fix, printed instead of the catalog's fix for ``pitfall`` where
    the catalog's would be wrong for what was found; empty = the catalog's fix is the fallback. Title,
    message and fix are said in the language of the notebook that ran the diagnosis (:mod:`tinytf.translation`:
    the caller wraps them in ``_()``, the Chinese lives in the one catalog)."""

    pitfall: Pitfall
    title: str
    message: str
    fix: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "pitfall", Pitfall(self.pitfall))  # a plain int from JSON becomes its name

    def __str__(self) -> str:
        tag = _("pitfall {number}").format(number=int(self.pitfall)) if self.pitfall else _("problem")
        return f"[{tag}] {self.title}: {self.text}"

    @property
    def text(self) -> str:
        """The message, ending with this finding's own fix when it has one the message does not state yet."""
        if self.fix and not split_fix(self.message)[1]:
            return self.message + fix_sentence(self.fix)
        return self.message


_FULL_WIDTH_END = ("。", "；", "：", "）", "，")  # Chinese punctuation: no space follows it


def sentences(first: str, then: str) -> str:
    """``first`` followed by ``then``: a space between them in English, none after Chinese punctuation
    ("…timing. Seen on …", "…时机。出现在…")."""
    if not then:
        return first
    return first + ("" if first.endswith(_FULL_WIDTH_END) else " ") + then


def found(pitfall: Pitfall, title: str, evidence: str, *, where: str = "", fix: bool | str = True) -> Finding:
    """A finding whose message is ``evidence``, then ``where`` (the inputs that show it), then the fix:
    ``fix`` when it is a string (this finding's own, already translated: ``fix=_("...")``), else the catalog's
    one-line fix for ``pitfall`` (the single source of that wording; none with ``fix=False``)."""
    message = sentences(evidence.rstrip(), where)
    if isinstance(fix, str):
        return Finding(pitfall, title, message + fix_sentence(fix), fix=fix)
    if fix and pitfall is not Pitfall.GENERAL:
        message += fix_sentence(_(pitfall.fix))
    return Finding(pitfall, title, message)


def report(findings: Iterable[Finding], *, name: str | None = None) -> str:
    """A readable summary of ``findings`` (one paragraph per finding); says so when there are none."""
    findings = list(findings)
    head = _("{name}: ").format(name=name) if name else ""
    if not findings:
        return head + _("OK - no problems found.")
    n = len(findings)
    lines = [head + ngettext("{n} problem found:", "{n} problems found:", n).format(n=n)]
    for f in findings:
        tag = f.pitfall.label()
        lines.append(f"  x [{tag}] {f.title}")
        lines.append(f"      {f.text}")
    return "\n".join(lines)


def _times(r: float) -> str:
    """``r`` (a clean ratio of a wrong value to the right one) in words: "exactly half the right value"."""
    if r == 2.0:
        return _("exactly twice the right value")
    if r == 0.5:
        return _("exactly half the right value")
    frac = Fraction(r).limit_denominator(64)
    if float(frac) == r:
        if frac.denominator == 1:
            return _("exactly {n}× the right value").format(n=frac.numerator)
        return _("exactly {num}/{den} of the right value").format(num=frac.numerator, den=frac.denominator)
    square = Fraction(r * r).limit_denominator(64)
    if math.isclose(float(square), r * r, rel_tol=1e-6):
        root = square.numerator if square.denominator == 1 else square.denominator
        return (_("exactly sqrt({root}) = {value:.3g}× the right value") if square.denominator == 1
                else _("exactly 1/sqrt({root}) = 1/{value:.3g} of the right value")).format(root=root, value=math.sqrt(root))
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

    - one ``step`` more or less (``step = (name, size)``, default one unit, size 0: none; ``name`` translated by the
      caller): "one tile more than the right value";
    - a ratio ``got / want`` that one of ``suspects`` (``{what it means (translated): ratio}``) predicts:
      "exactly half the right value: dtype_bytes=4 looks ignored";
    - else a clean ratio (×2, ÷2, 3/4, sqrt(8), …): "exactly 1/sqrt(8) = 1/2.83 of the right value".
    """
    if got == want or not want or not all(map(math.isfinite, (got, want))):
        return ""
    name, size = step or ("", 1.0)
    if size and math.isclose(abs(got - want), size, rel_tol=tol, abs_tol=tol):
        if name:
            return (_("one {name} more than the right value (off by one)") if got > want
                    else _("one {name} less than the right value (off by one)")).format(name=name)
        return _("one more than the right value (off by one)") if got > want else _("one less than the right value (off by one)")
    r = got / want
    for meaning, ratio in (suspects or {}).items():
        if ratio and math.isclose(r, ratio, rel_tol=max(tol, 1e-12)):
            times = _times(_clean(r, max(tol, 1e-12)) or r) or _("{ratio:.4g}× the right value").format(ratio=r)
            return _("{times}: {meaning}").format(times=times, meaning=meaning)
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
    if i < len(names):
        said = (_("dim {i} ({name}) has one more ({got}) than it should ({want})") if g > w
                else _("dim {i} ({name}) has one less ({got}) than it should ({want})"))
    else:
        said = (_("dim {i} has one more ({got}) than it should ({want})") if g > w
                else _("dim {i} has one less ({got}) than it should ({want})"))
    return said.format(i=i, name=names[i] if i < len(names) else "", got=g, want=w)


def _indices(idx: Sequence[int], limit: int = 6) -> str:
    shown = ", ".join(str(i) for i in idx[:limit])
    return shown + (", …" if len(idx) > limit else "")


def slice_map(got: object, want: object, dim: int, *, atol: float = 1e-5) -> list[int | None]:
    """For each index ``i`` along ``dim`` of ``got``: the first index ``j`` along ``dim`` of ``want`` whose slice
    equals ``got``'s slice ``i`` (to ``atol``), else ``None``; ``[]`` when the other axes differ in size."""
    import torch

    if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)) or got.dim() != want.dim():
        return []
    g, w = got.detach().float().movedim(dim, 0), want.detach().float().movedim(dim, 0)
    if g.shape[1:] != w.shape[1:]:
        return []
    out: list[int | None] = []
    for row in g:
        hits = [j for j in range(w.size(0)) if torch.allclose(row, w[j], atol=atol, rtol=1e-4, equal_nan=True)]
        out.append(hits[0] if hits else None)
    return out


def slices_relation(got: object, want: object, dim: int, name: str) -> str:
    """When every slice of ``got`` along ``dim`` is some slice of ``want``, but not slice ``i`` at place ``i``:
    "your {name}s 0, 1, 2, 3 are the reference's {name}s 0, 1, 0, 1" (``name`` translated by the caller); else ``""``."""
    found_at = slice_map(got, want, dim)
    if not found_at or any(j is None for j in found_at) or found_at == list(range(len(found_at))):
        return ""
    return _("your {name} {mine} are the reference's {name} {theirs}").format(
        name=name, mine=_indices(list(range(len(found_at))), 12), theirs=_indices([int(j) for j in found_at], 12))


def difference_pattern(got: object, want: object, names: Sequence[str] = (), *, spread: bool = True) -> str:
    """Where two tensors of one shape differ, in words: "only dim 2 (Tq) indices 0, 3 differ" (the axes along which
    the differences are confined), "NaN at …", or (``spread``) how many entries differ when no axis confines them;
    ``""`` when they agree or cannot be compared."""
    import torch

    if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)) or got.shape != want.shape or got.numel() == 0:
        return ""
    g, w = got.detach().double(), want.detach().double()
    off = ~torch.isclose(g, w, rtol=1e-4, atol=1e-5, equal_nan=True)
    if not bool(off.any()):
        return ""
    said, located = [], False
    if bool(torch.isnan(g).any()) and not bool(torch.isnan(w).any()):
        said.append(_("yours holds NaN in {n} of {total} entries").format(n=int(torch.isnan(g).sum()), total=g.numel()))
    for axis in range(off.dim()):
        along = off.movedim(axis, 0).reshape(off.size(axis), -1).any(dim=1)
        if 0 < int(along.sum()) < along.numel():
            idx = along.nonzero().flatten().tolist()
            label = (_("dim {i} ({name})").format(i=axis, name=names[axis]) if axis < len(names) and names[axis]
                     else _("dim {i}").format(i=axis))
            said.append(_("only {label} indices {idx} differ").format(label=label, idx=_indices(idx)))
            located = True
    if not located and spread:
        said.append(_("{n} of {total} entries differ, spread over every axis").format(n=int(off.sum()), total=off.numel()))
    return "; ".join(said)
