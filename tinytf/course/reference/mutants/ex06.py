"""Exercise 6's mutants: counting the saved-for-backward bytes, the benchmark of both attention paths (see :mod:`.`)."""

from __future__ import annotations

from typing import Any

import torch

from tinytf.checks import Pitfall

from ....translation import N_
from . import Correct, Family, Mutant

SAVED = Family(
    task="ex06_saved", cell="ex06_saved_code", subject="saved_tensor_bytes",
    source=("def saved_tensor_bytes(fn: Callable[..., torch.Tensor], *args: object) -> int:\n"
            "    total = 0\n"
            "\n"
            "    def pack(t: torch.Tensor) -> torch.Tensor:\n"
            "        nonlocal total\n"
            "        total += t.numel() * t.element_size()\n"
            "        return t\n"
            "\n"
            "    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):\n"
            "        fn(*args)\n"
            "    return total\n"),
    mutants=(
        Mutant("elements", Pitfall.GENERAL, N_("saved_tensor_bytes counts elements, not bytes"),
               N_("your counts are exactly 1/4 of the bytes on float32 tensors: t.numel() without t.element_size()."),
               N_("multiply t.numel() by t.element_size() (4 for float32)"),
               edits=(("total += t.numel() * t.element_size()", "total += t.numel()"),)),
        Mutant("bits", Pitfall.GENERAL, N_("saved_tensor_bytes counts bits"),
               N_("your counts are exactly 8 times the bytes: t.numel() * t.element_size() * 8."),
               N_("count bytes: t.numel() * t.element_size(), without * 8"),
               edits=(("total += t.numel() * t.element_size()", "total += t.numel() * t.element_size() * 8"),)),
        Mutant("unpack_hook", Pitfall.GENERAL, N_("saved_tensor_bytes counts in the unpack hook"),
               N_("your counts are 0: the counter is the unpack hook, which runs only when backward reads the saved tensors."),
               N_("count in the pack hook, the first argument: saved_tensors_hooks(pack, unpack)"),
               edits=(("saved_tensors_hooks(pack, lambda t: t)", "saved_tensors_hooks(lambda t: t, pack)"),)),
        Mutant("float_total", Pitfall.GENERAL, N_("saved_tensor_bytes must return an int"),
               N_("your count is a float; a number of bytes is an int."),
               N_("add up the int t.numel() * t.element_size() of each saved tensor"), edits=(("return total", "return float(total)"),)),
        Mutant("first_three_args", Pitfall.MASK, N_("saved_tensor_bytes drops fn's later arguments"),
               N_("your counts for a causal call equal those without the mask: only the first three arguments reach fn, so "
                  "is_causal is lost."),
               N_("pass every argument through: fn(*args)"), edits=(("        fn(*args)", "        fn(*args[:3])"),)),
    ),
    correct=(Correct("nbytes", edits=(("total += t.numel() * t.element_size()", "total += t.nbytes"),)),
             Correct("list_of_sizes", edits=(("total += t.numel() * t.element_size()",
                                              "total += sum([t.element_size()] * t.numel())"),))),
)


def _bench_signature(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    """A small fresh run of the student's benchmark_attention (tinytf's saved_tensor_bytes inside): its keys, conditions
    and saved bytes, the parts a CPU measures exactly (times and peaks vary from run to run)."""
    from .. import swapped
    from ..ex06 import saved_bytes

    ts = [16, 32]
    with swapped(ns, saved_tensor_bytes=saved_bytes):
        res = ns["benchmark_attention"](ts, batch=1, heads=1, head_dim=4, dtype=torch.float32, causal=True, warmup=0, repeats=1,
                                        device="cpu")
    from ..ex06 import CONDITION_KEYS

    conditions = res.get("conditions", {}) if isinstance(res.get("conditions"), dict) else {}
    out: dict[str, Any] = {"paths": sorted(k for k in res if k != "conditions"), "conditions": all(k in conditions for k in CONDITION_KEYS)}
    out["mask"] = conditions.get("mask")
    for name in ("explicit", "sdpa"):
        table = res.get(name, {})
        out[name] = {repr(t): int(row["saved_bytes"]) for t, row in table.items()} if isinstance(table, dict) else None
    return out, {"ts": ts}


_CAUSAL = (("fn(q, k, v, causal).sum().backward()", "fn(q, k, v).sum().backward()"),
           ("saved_tensor_bytes(fn, q, k, v, causal)", "saved_tensor_bytes(fn, q, k, v)"))

BENCH = Family(
    task="ex06_bench", cell="ex06_bench_code", subject="benchmark_attention",
    source=("def benchmark_attention(ts: list[int] | tuple[int, ...], *, batch: int = 1, heads: int = 2, head_dim: int = 32,\n"
            "                        dtype: torch.dtype = torch.float32, causal: bool = True, warmup: int = 1, repeats: int = 3,\n"
            "                        device: str | torch.device = \"cpu\") -> dict:\n"
            "    device = torch.device(device)\n"
            "    dtype_name = str(dtype).removeprefix(\"torch.\")\n"
            "    conditions = {\"batch\": batch, \"heads\": heads, \"head_dim\": head_dim, \"dtype\": dtype_name,\n"
            "                  \"mask\": \"causal\" if causal else \"none\", \"device\": str(device), \"warmup\": warmup,\n"
            "                  \"repeats\": repeats, \"torch\": str(torch.__version__)}\n"
            "    results = {\"conditions\": conditions}\n"
            "    for name, fn in PATHS.items():\n"
            "        results[name] = {}\n"
            "        for t in ts:\n"
            "            q, k, v = (torch.randn(batch, heads, t, head_dim, device=device, dtype=dtype, requires_grad=True) "
            "for _ in range(3))\n"
            "\n"
            "            def step(fn: Callable[..., torch.Tensor] = fn, q: torch.Tensor = q, k: torch.Tensor = k, "
            "v: torch.Tensor = v) -> None:\n"
            "                fn(q, k, v, causal).sum().backward()\n"
            "\n"
            "            res = tinytf.bench.benchmark(step, warmup=warmup, iters=repeats, device=device,\n"
            "                                         B=batch, T=t, heads=heads, dtype=dtype_name, backend=name)\n"
            "            results[name][t] = {\"saved_bytes\": saved_tensor_bytes(fn, q, k, v, causal), \"peak_bytes\": res.peak_bytes,\n"
            "                                \"ms\": res.median_ms, \"tokens_per_s\": res.tokens_per_s}\n"
            "            conditions[\"timer\"] = res.conditions[\"timer\"]\n"
            "            conditions[\"memory_method\"] = res.conditions[\"memory_method\"]\n"
            "    return results\n"),
    mutants=(
        Mutant("causal_not_passed", Pitfall.MASK, N_("benchmark_attention measures without the causal mask"),
               N_("your conditions say mask='causal', but both paths save exactly the bytes of attention without a mask: causal "
                  "never reaches fn."),
               N_("pass causal on to both paths: fn(q, k, v, causal), in the timed step and in saved_tensor_bytes"), edits=_CAUSAL),
        Mutant("first_t_only", Pitfall.GENERAL, N_("saved bytes do not grow with T"),
               N_("every T of yours saves the bytes of the first T: q, k and v are drawn with ts[0] tokens each time."),
               N_("measure each T on its own q, k, v of length T"),
               edits=(("torch.randn(batch, heads, t, head_dim", "torch.randn(batch, heads, ts[0], head_dim"),)),
        Mutant("no_conditions", Pitfall.COLD_TIMING, N_("benchmark_attention does not record its conditions"),
               N_("your results hold the measurements without 'conditions': a number without its conditions cannot be compared."),
               N_("return them under 'conditions': batch, heads, head_dim, dtype, mask, device, repeats"),
               edits=(('results = {"conditions": conditions}', "results = {}"),)),
        Mutant("str_keys", Pitfall.GENERAL, N_("benchmark_attention keys the rows by strings"),
               N_("your rows are keyed '256', '512', …; each path's table is keyed by the int T itself."),
               N_("key each row by T: results[name][t] = {...}"), edits=(("results[name][t] = {", "results[name][str(t)] = {"),)),
        Mutant("one_path", Pitfall.GENERAL, N_("benchmark_attention counts the explicit path's bytes for both"),
               N_("your sdpa rows save exactly the explicit path's bytes: saved_tensor_bytes always runs explicit attention."),
               N_("measure each path with its own function: saved_tensor_bytes(fn, q, k, v, causal)"),
               edits=(("saved_tensor_bytes(fn, q, k, v, causal)", "saved_tensor_bytes(PATHS[\"explicit\"], q, k, v, causal)"),)),
    ),
    correct=(Correct("lambda_step", edits=(("            res = tinytf.bench.benchmark(step,",
                                            "            res = tinytf.bench.benchmark(lambda: step(),"),)),
             Correct("int_keys_loop_order", edits=(("    for name, fn in PATHS.items():\n        results[name] = {}\n",
                                                    "    for name in PATHS:\n        fn = PATHS[name]\n        results[name] = {}\n"),))),
    signature=_bench_signature,
    reruns=("ex06_c12",),
)

FAMILIES = (SAVED, BENCH)
