"""Exercise 3's mutants: the parameter count, the timer, the per-head maps and the experiment's results (see :mod:`.`)."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from tinytf.checks import Pitfall

from ....translation import N_
from . import Correct, Family, Mutant

PARAM_COUNT = Family(
    task="ex03_param_count", cell="ex03_params_answer", subject="mha_parameter_count",
    source=("def mha_parameter_count(dim: int, heads: int, bias: bool = True) -> int:\n"
            "    qkv = 3 * dim * dim + (3 * dim if bias else 0)\n"
            "    proj = dim * dim + (dim if bias else 0)\n"
            "    return qkv + proj\n"),
    mutants=(
        Mutant("no_proj", Pitfall.GENERAL, N_("mha_parameter_count leaves out the output projection"),
               N_("your counts are 3·D·D (+ 3·D with bias): the qkv projection only."),
               N_("add the output projection proj (D -> D): D·D + D"), edits=(("return qkv + proj", "return qkv"),)),
        Mutant("weights_only", Pitfall.GENERAL, N_("mha_parameter_count leaves out the biases"),
               N_("your counts are 4·D·D whatever bias says: the weights only."),
               N_("with bias=True add one bias per output of each Linear: 3D + D"),
               edits=(("(3 * dim if bias else 0)", "0"), ("(dim if bias else 0)", "0"))),
        Mutant("bias_always", Pitfall.GENERAL, N_("mha_parameter_count counts biases that bias=False leaves out"),
               N_("your counts are 4·D·D + 4·D whatever bias says: with bias=False the module has no biases."),
               N_("with bias=False count the weights only: 4·D·D"),
               edits=(("(3 * dim if bias else 0)", "3 * dim"), ("(dim if bias else 0)", "dim"))),
        Mutant("per_head", Pitfall.GENERAL, N_("mha_parameter_count divides by the head count"),
               N_("your counts are the module's divided by heads: the heads share one D x 3D projection, each uses a slice of it."),
               N_("do not divide by heads: the heads share the D x 3D projection, each uses a slice"),
               edits=(("return qkv + proj", "return (qkv + proj) // heads"),)),
        Mutant("times_heads", Pitfall.GENERAL, N_("mha_parameter_count counts a projection per head"),
               N_("your qkv weights are counted heads times (3·D·D·heads): one Linear [3D, D] serves every head."),
               N_("one qkv Linear [3D, D] serves all heads: 3·D·D, not 3·D·D·heads"),
               edits=(("3 * dim * dim +", "3 * dim * dim * heads +"),)),
        Mutant("qkv_bias_d", Pitfall.GENERAL, N_("mha_parameter_count counts a qkv bias of D"),
               N_("your counts hold a qkv bias of D entries; qkv has 3·D outputs, so its bias has 3·D."),
               N_("qkv's bias has 3·D entries, one per output row"), edits=(("(3 * dim if bias else 0)", "(dim if bias else 0)"),)),
    ),
    affects=("ex03_results",),
    correct=(Correct("factored", edits=(("return qkv + proj", "return 4 * dim * (dim + (1 if bias else 0))"),)),
             Correct("shapes", edits=(("return qkv + proj", "return sum(a * b for a, b in ((3 * dim, dim), (dim, dim))) "
                                                            "+ (4 * dim if bias else 0)"),))),
)


class _Sleepy(torch.nn.Module):
    """Sleeps ``first_s`` on its first call, ``then_s`` after; keeps how long each call took inside."""

    def __init__(self, first_s: float, then_s: float) -> None:
        super().__init__()
        self.first_s, self.then_s, self.inner = first_s, then_s, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        start = time.perf_counter()
        time.sleep(self.first_s if not self.inner else self.then_s)
        self.inner.append(time.perf_counter() - start)
        return x


def _timing_signature(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    """How a timer relates to what the module measured inside itself: per call, 1000×, the total, (almost) nothing,
    dominated by a slow first call, or fewer calls than asked; orders of magnitude apart, so a loaded machine cannot
    move a timer from one to another."""
    x = torch.zeros(1, 2, 4)
    steady, cold = _Sleepy(0.002, 0.002), _Sleepy(0.06, 0.001)
    got = ns["time_forward"](steady, x, repeats=6, warmup=2)
    got_cold = ns["time_forward"](cold, x, repeats=6, warmup=2)
    call = statistics.median(steady.inner) if steady.inner else 0.002
    ratio = float(got) / call if isinstance(got, (int, float)) else -1.0
    cold_ratio = float(got_cold) / (sum(cold.inner) / len(cold.inner)) if isinstance(got_cold, (int, float)) and cold.inner else -1.0
    kind = ("ms" if ratio > 300 else "total" if ratio > 3 else "nothing" if 0 <= ratio < 0.5 else "call" if ratio >= 0 else "?")
    return {"kind": kind, "calls": len(steady.inner) >= 8, "cold": cold_ratio >= 0.5}, {}


TIMING = Family(
    task="ex03_timing", cell="ex03_time_answer", subject="time_forward",
    source=("def time_forward(module: torch.nn.Module, x: torch.Tensor, repeats: int = 20, warmup: int = 3) -> float:\n"
            "    times = []\n"
            "    with torch.no_grad():\n"
            "        for _ in range(warmup):\n"
            "            module(x)\n"
            "        tinytf.synchronize(x.device)\n"
            "        for _ in range(repeats):\n"
            "            start = time.perf_counter()\n"
            "            module(x)\n"
            "            tinytf.synchronize(x.device)\n"
            "            times.append(time.perf_counter() - start)\n"
            "    return statistics.median(times)\n"),
    mutants=(
        Mutant("milliseconds", Pitfall.COLD_TIMING, N_("time_forward returns milliseconds"),
               N_("your timer reports about 1000 times what a call takes in seconds: each time is multiplied by 1000."),
               N_("return seconds: time.perf_counter() differences, not multiplied by 1000"),
               edits=(("times.append(time.perf_counter() - start)", "times.append((time.perf_counter() - start) * 1000)"),)),
        Mutant("total", Pitfall.COLD_TIMING, N_("time_forward returns the total, not the time per call"),
               N_("your timer reports the sum of the timed calls: `repeats` times one call."),
               N_("time each call on its own and return the median of the per-call times"),
               edits=(("return statistics.median(times)", "return sum(times)"),)),
        Mutant("cold_mean", Pitfall.COLD_TIMING, N_("the first (cold) call dominates time_forward"),
               N_("your timer has no warm-up and reports the mean: a module whose first call is slow is measured at about its "
                  "mean including that call."),
               N_("run `warmup` untimed calls first, then report the median of the timed ones"),
               edits=(("        for _ in range(warmup):\n            module(x)\n", ""),
                      ("return statistics.median(times)", "return statistics.mean(times)"))),
        Mutant("clock_after_call", Pitfall.COLD_TIMING, N_("time_forward measures too little"),
               N_("your timer starts the clock after module(x): it measures the time between the call and the next line, about "
                  "nothing."),
               N_("time each call around model(x) itself (and synchronise on a GPU)"),
               edits=(("start = time.perf_counter()\n            module(x)\n", "module(x)\n            start = time.perf_counter()\n"),)),
        Mutant("one_call", Pitfall.COLD_TIMING, N_("time_forward times one call, not `repeats`"),
               N_("your timer calls the module fewer times than warmup + repeats: one timed call is no median."),
               N_("time `repeats` calls: for _ in range(repeats)"),
               edits=(("for _ in range(repeats):", "for _ in range(1):"),)),
    ),
    correct=(Correct("loop_timer", edits=(("times.append(time.perf_counter() - start)",
                                           "stop = time.perf_counter()\n            times.append(stop - start)"),)),
             Correct("sorted_middle", edits=(("return statistics.median(times)", "return float(torch.tensor(times).median())"),))),
    signature=_timing_signature,
)


def _heads(value: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    heads, dim = int(inputs["heads"]), int(inputs["x"].size(-1))
    return {"d_head": dim // heads, "dim": dim, "root": (dim // heads) ** 0.5, "root_d": dim ** 0.5}


BY_SQRT = N_("divide the scores by math.sqrt(mha.head_dim), one head's width")

HEAD_MAPS = Family(
    task="ex03_head_maps", cell="ex03_maps_answer", subject="per_head_weights",
    source=("def per_head_weights(mha: tinytf.MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:\n"
            "    b, t, _ = x.shape\n"
            "    q, k, _v = mha.qkv(x).chunk(3, dim=-1)\n"
            "    q = q.view(b, t, mha.heads, mha.head_dim).transpose(1, 2)\n"
            "    k = k.view(b, t, mha.heads, mha.head_dim).transpose(1, 2)\n"
            "    scores = q @ k.transpose(-2, -1) / math.sqrt(mha.head_dim)\n"
            "    return scores.softmax(dim=-1)\n"),
    mutants=(
        Mutant("unscaled", Pitfall.SCALE, N_("per_head_weights: missing scaling"),
               N_("your weights are softmax(q kᵀ) per head: the scores are not scaled at all."), BY_SQRT,
               edits=((" / math.sqrt(mha.head_dim)", ""),)),
        Mutant("by_d_head", Pitfall.SCALE, N_("per_head_weights: scores divided by d_head instead of sqrt(d_head)"),
               N_("your weights are softmax(q kᵀ / d_head): with d_head = {d_head} the scale is 1/sqrt(d_head) = 1/{root:.3g}, not "
                  "1/{d_head}."), BY_SQRT, facts=_heads, edits=(("math.sqrt(mha.head_dim)", "mha.head_dim"),)),
        Mutant("by_model_width", Pitfall.SCALE, N_("per_head_weights: scaled by the model width"),
               N_("your weights are softmax(q kᵀ / sqrt(D)) with D = {dim}: the scale is 1/sqrt(d_head) = 1/{root:.3g} (one head's "
                  "width), not 1/sqrt(D) = 1/{root_d:.3g}."), BY_SQRT, facts=_heads,
               edits=(("math.sqrt(mha.head_dim)", "math.sqrt(x.size(-1))"),)),
        Mutant("over_queries", Pitfall.ORIENTATION, N_("per_head_weights: softmax over the wrong axis"),
               N_("your weights are the softmax over dim -2: each column sums to one, not each row; the softmax ran over the queries."),
               N_("normalise over the keys, the last axis: softmax(dim=-1)"), edits=(("softmax(dim=-1)", "softmax(dim=-2)"),)),
        Mutant("reshape_heads", Pitfall.VIEW_AFTER_TRANSPOSE, N_("per_head_weights: heads split with the wrong reshape"),
               N_("your heads come from reshape(B, H, T, d_head) of the [B, T, D] projections: that mixes tokens and channels, so "
                  "each 'head' holds pieces of several tokens."),
               N_("split with view(B, T, H, d_head).transpose(1, 2)"),
               edits=(("q = q.view(b, t, mha.heads, mha.head_dim).transpose(1, 2)", "q = q.reshape(b, mha.heads, t, mha.head_dim)"),
                      ("k = k.view(b, t, mha.heads, mha.head_dim).transpose(1, 2)", "k = k.reshape(b, mha.heads, t, mha.head_dim)"))),
        Mutant("chunks_swapped", Pitfall.ORIENTATION, N_("per_head_weights takes q and k from the wrong thirds"),
               N_("your q is the second third of mha.qkv(x) and your k the first: qkv's outputs are [q; k; v] in that order."),
               N_("unpack in qkv's order: q, k, v = mha.qkv(x).chunk(3, dim=-1)"),
               edits=(("q, k, _v = mha.qkv(x)", "k, q, _v = mha.qkv(x)"),)),
    ),
    affects=("ex03_results",),
    correct=(Correct("einsum", edits=(("scores = q @ k.transpose(-2, -1) / math.sqrt(mha.head_dim)",
                                       'scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(mha.head_dim)'),)),
             Correct("unflatten", edits=(("q = q.view(b, t, mha.heads, mha.head_dim).transpose(1, 2)",
                                          "q = q.unflatten(-1, (mha.heads, mha.head_dim)).permute(0, 2, 1, 3)"),
                                         ("k = k.view(b, t, mha.heads, mha.head_dim).transpose(1, 2)",
                                          "k = k.unflatten(-1, (mha.heads, mha.head_dim)).permute(0, 2, 1, 3)")))),
)


def _results(change: Any) -> Any:
    """A bind that rewrites every entry of the notebook's ``results`` with ``change(h, entry, ns) -> entry``."""
    def bind(ns: dict[str, Any]) -> dict[str, Any]:
        return {"results": {h: change(h, dict(r), ns) for h, r in ns["results"].items()}}
    return bind


def _one_module(h: int, r: dict, ns: dict[str, Any]) -> dict:
    r["weights"] = ns["results"][ns["HEADS"][0]]["weights"]
    return r


def _no_bias(h: int, r: dict, ns: dict[str, Any]) -> dict:
    r["params"] = 4 * ns["DIM"] * ns["DIM"]
    return r


def _results_signature(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    """What the experiment's results are, entry by entry: the key type, each time as a multiple of the forward time
    measured beside it (per call, or about 1000 times: milliseconds), the maps' shape, the parameter count's relation
    to the module's (its own, the weights only, another)."""
    from tinytf import MultiHeadAttention, count_parameters

    from ..ex03 import beside_time

    results, heads, dim, x = ns["results"], ns["HEADS"], ns["DIM"], ns["x"]
    out: dict[str, Any] = {"keys": sorted(type(k).__name__ for k in results)}
    for h in heads:
        r = results.get(h, results.get(str(h)))
        if not isinstance(r, dict):
            out[str(h)] = None
            continue
        with torch.random.fork_rng(devices=[]):
            ratio = float(r.get("time_s", 0.0)) / beside_time(MultiHeadAttention(dim, h), x)
        w, n = r.get("weights"), r.get("params")
        out[str(h)] = {"time": "1000x" if ratio > 300 else "per call" if ratio > 1 / 30 else "less",
                       "weights": list(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__,
                       "params": "module" if n == count_parameters(MultiHeadAttention(dim, h)) else "weights only"
                       if n == 4 * dim * dim else "other"}
    return out, {"heads": list(heads)}


RESULTS = Family(
    task="ex03_results", cell="ex03_experiment_answer", subject="results",
    source=("REPEATS, WARMUP = 30, 3\n"
            "results = {}\n"
            "for h in HEADS:\n"
            "    torch.manual_seed(0)\n"
            "    mha = tinytf.MultiHeadAttention(DIM, h).to(DEVICE)\n"
            "    with torch.no_grad():\n"
            "        weights = per_head_weights(mha, x)\n"
            "    results[h] = {\"params\": mha_parameter_count(DIM, h), \"time_s\": time_forward(mha, x, repeats=REPEATS, "
            "warmup=WARMUP), \"weights\": weights}\n"),
    mutants=(
        Mutant("time_ms", Pitfall.COLD_TIMING, N_("results hold milliseconds"),
               N_("your results' time_s are about 1000 times a forward call's time measured beside them: milliseconds, not "
                  "seconds."),
               N_("store time_forward's seconds as they are"), bind=_results(lambda h, r, ns: {**r, "time_s": r["time_s"] * 1000})),
        Mutant("sequence0", Pitfall.GENERAL, N_("results keep the maps of sequence 0 only"),
               N_("your results[h]['weights'] are [h, T, T]: the batch axis is gone; the test wants per_head_weights(mha, x) whole, "
                  "[B, h, T, T]."),
               N_("store per_head_weights(mha, x) as it is, [B, h, T, T]"),
               bind=_results(lambda h, r, ns: {**r, "weights": r["weights"][0] if r["weights"].dim() == 4 else r["weights"]})),
        Mutant("string_keys", Pitfall.GENERAL, N_("results are keyed by strings"),
               N_("your results are keyed '1', '2', '4'; the head counts themselves (ints, as in HEADS) are the keys."),
               N_("key the results by the head count itself: results[h] = {...}"),
               bind=lambda ns: {"results": {str(h): r for h, r in ns["results"].items()}}),
        Mutant("one_module", Pitfall.GENERAL, N_("results hold the maps of one module for every head count"),
               N_("your results[h]['weights'] are [B, {first}, T, T] for every h: the module was built once, outside the loop."),
               N_("build tinytf.MultiHeadAttention(DIM, h) inside the loop, one per head count"), bind=_results(_one_module),
               facts=lambda value, inputs: {"first": inputs["heads"][0]}),
        Mutant("params_no_bias", Pitfall.GENERAL, N_("results count the weights only"),
               N_("your results' params are 4·D·D: the module's biases (4·D with bias=True) are left out."),
               N_("store mha_parameter_count(DIM, h) with its default bias=True"), bind=_results(_no_bias)),
    ),
    correct=(Correct("module_count", bind=_results(lambda h, r, ns: {**r, "params": sum(p.numel() for p in
                                                                                          __import__("tinytf").MultiHeadAttention(
                                                                                              ns["DIM"], h).parameters())})),
             Correct("python_floats", bind=_results(lambda h, r, ns: {**r, "time_s": float(r["time_s"]),
                                                                     "weights": r["weights"].clone()}))),
    signature=_results_signature,
)

FAMILIES = (PARAM_COUNT, TIMING, HEAD_MAPS, RESULTS)
