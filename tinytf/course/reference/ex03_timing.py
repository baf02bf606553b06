"""Exercise 3's timing part: ``time_forward(module, x, repeats=20, warmup=3) -> float`` (median seconds per
call) run on modules that sleep, the record its judge reads, the rule that judges it (times compared only
with times measured beside them, as ratios) and the self-check's diagnosis of a wrong timer."""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch
from torch import nn

from tinytf.checks import Finding, Pitfall, found

from ...translation import gettext
from . import call_student
from .validators import has_keys, seconds

__all__ = ["Sleepy", "timing_problem", "timing_record", "diagnose_timing"]


class Sleepy(nn.Module):
    """Sleeps ``first_s`` on its first call and ``then_s`` on every later one; counts its ``calls`` and
    keeps how long each took inside (``inner``, seconds on ``time.perf_counter``)."""

    def __init__(self, first_s: float, then_s: float) -> None:
        super().__init__()
        self.calls, self.first_s, self.then_s, self.inner = 0, first_s, then_s, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        time.sleep(self.first_s if self.calls == 0 else self.then_s)
        self.inner.append(time.perf_counter() - start)
        self.calls += 1
        return x


def timing_problem(value: Any, repeats: int) -> str | None:
    """What is wrong with a :func:`timing_record` (None: nothing). Times are compared only with each
    other, as ratios, never with a number of seconds: every bound is what the modules themselves
    measured inside their calls, in the same process on the same clock, so a loaded machine (which
    slows every call alike) cannot push a correct answer across one.

    - per call, not less: every timed call contains its module's own call, so a median of them is at
      least ``0.9 ×`` the median of the module's inner durations;
    - per call, not the total (nor milliseconds): below half the sum of the last ``repeats`` inner
      durations (a median is at most ``2 / repeats`` of that sum, plus the loop's own microseconds);
    - the slow first call excluded: below half the mean of the cold module's inner durations (its
      first call is 100 times its machine's slowest steady call, so a mean that includes it is far above).
    """
    has_keys(value, ("steady_s", "cold_s", "calls", "steady_inner", "cold_inner"), gettext("the timing record"))
    steady = seconds(value["steady_s"], "time_forward")
    cold = seconds(value["cold_s"], gettext("time_forward (slow first call)"))
    inner, cold_inner = [float(t) for t in value["steady_inner"]], [float(t) for t in value["cold_inner"]]
    if int(value["calls"]) < int(repeats) or len(inner) < int(repeats) or not cold_inner:
        return gettext("time_forward must call the module at least `repeats` times")
    timed = inner[-int(repeats):]
    if not 0.9 * statistics.median(timed) <= steady < 0.5 * sum(timed):
        return gettext("time_forward: implausible seconds per call (report the median seconds of one call)")
    if not cold < 0.5 * sum(cold_inner) / len(cold_inner):
        return gettext("time_forward: a slow first call dominates the result (warm up, take the median)")
    return None


def timing_record(time_forward: Any, repeats: int, sleep_s: float) -> dict[str, Any]:
    """Run ``time_forward`` on a module that sleeps ``sleep_s`` per call, then on one whose first call
    is 100 times slower than the slowest call just measured (at least 0.5 s): the record
    :func:`timing_problem` judges, with each module's own inner durations."""
    x = torch.zeros(1, 2, 4)
    steady = Sleepy(sleep_s, sleep_s)
    steady_s = time_forward(steady, x, repeats=repeats, warmup=2)
    cold = Sleepy(max(0.5, 100 * max(steady.inner, default=sleep_s)), 0.001)
    cold_s = time_forward(cold, x, repeats=repeats, warmup=2)
    return {"steady_s": steady_s, "cold_s": cold_s, "calls": steady.calls, "steady_inner": steady.inner,
            "cold_inner": cold.inner}


def diagnose_timing(fn: Any) -> list[Finding]:
    x = torch.zeros(1, 2, 4)
    probe = Sleepy(0.003, 0.003)
    steady, problem = call_student("time_forward", fn, probe, x, repeats=12, warmup=1)
    if problem:
        return [problem]
    if not isinstance(steady, float) or not math.isfinite(steady) or steady <= 0:
        return [found(Pitfall.GENERAL, gettext("time_forward must return a positive float"),
                      gettext("got {steady!r}.").format(steady=steady),
                      fix=gettext("return the median seconds per call as a float"))]
    call = statistics.median(probe.inner[-12:]) if len(probe.inner) >= 12 else 0.003  # what one call took, measured inside it
    if steady >= 500 * call:
        return [found(Pitfall.COLD_TIMING, gettext("time_forward returns milliseconds"),
                      gettext("a module that sleeps 3 ms per call measured {steady:.4g}, about 1000× its time in seconds.").format(
                          steady=steady),
                      fix=gettext("return seconds: time.perf_counter() differences, not multiplied by 1000"))]
    if steady < 0.9 * call:
        return [found(Pitfall.COLD_TIMING, gettext("time_forward measures too little"),
                      gettext("a module that sleeps 3 ms per call measured {value:.2f} ms.").format(value=steady * 1e3),
                      fix=gettext("time each call around model(x) itself (and synchronise on a GPU)"))]
    if len(probe.inner) >= 12 and steady >= 0.5 * sum(probe.inner[-12:]):
        return [found(Pitfall.COLD_TIMING, gettext("time_forward returns the total, not the time per call"),
                      gettext("a module that sleeps 3 ms per call measured {steady:.4f} s.").format(steady=steady),
                      fix=gettext("time each call on its own and return the median of the per-call times"))]
    slow = Sleepy(max(0.2, 100 * max(probe.inner, default=0.003)), 0.001)
    cold, problem = call_student("time_forward", fn, slow, x, repeats=5, warmup=1)
    if problem:
        return [problem]
    if isinstance(cold, float) and slow.inner and cold >= 0.5 * sum(slow.inner) / len(slow.inner):
        return [found(Pitfall.COLD_TIMING, gettext("the first (cold) call dominates time_forward"),
                      gettext("a module whose first call takes {value:.0f} ms and later ones 1 ms measured {value2:.1f} ms per call.")
                      .format(value=slow.inner[0] * 1e3, value2=cold * 1e3),
                      fix=gettext("run `warmup` untimed calls first, then report the median of the timed ones"))]
    return []
