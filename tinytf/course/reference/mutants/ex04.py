"""Exercise 4's mutants: the pre-norm and post-norm blocks, the training curve and the comparison (see :mod:`.`)."""

from __future__ import annotations

from typing import Any

import torch

from tinytf.checks import Pitfall

from ....translation import N_
from . import Correct, Family, Mutant

PRE = Family(
    task="ex04_pre_block", cell="ex04_pre_answer", subject="PreNormBlock",
    source=("class PreNormBlock(nn.Module):\n"
            "    def __init__(self, dim: int, heads: int, max_tokens: int, expansion: int = 4) -> None:\n"
            "        super().__init__()\n"
            "        self.norm1 = nn.LayerNorm(dim)\n"
            "        self.attn = tinytf.CausalSelfAttention(dim, heads, max_tokens)\n"
            "        self.norm2 = nn.LayerNorm(dim)\n"
            "        self.ffn = nn.Sequential(nn.Linear(dim, expansion * dim), nn.GELU(), nn.Linear(expansion * dim, dim))\n"
            "\n"
            "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
            "        x = x + self.attn(self.norm1(x))\n"
            "        return x + self.ffn(self.norm2(x))\n"),
    mutants=(
        Mutant("relu", Pitfall.GENERAL, N_("PreNormBlock: the feed-forward net uses ReLU, not GELU"),
               N_("with tinytf's weights your block differs only through its activation: PreNormBlock.ffn holds ReLU; "
                  "tinytf.TransformerBlock's ffn is Sequential(Linear, GELU, Linear)."),
               N_("build the ffn with nn.GELU() instead of nn.ReLU()"), edits=(("nn.GELU()", "nn.ReLU()"),)),
        Mutant("post_layout", Pitfall.GENERAL, N_("PreNormBlock computes the post-norm layout"),
               N_("with tinytf's weights your block matches TransformerBlock(norm='post'): the norms sit after the residual sums."),
               N_("PreNormBlock.forward computes x = x + attn(norm1(x)); x = x + ffn(norm2(x))"),
               edits=(("x = x + self.attn(self.norm1(x))", "x = self.norm1(x + self.attn(x))"),
                      ("return x + self.ffn(self.norm2(x))", "return self.norm2(x + self.ffn(x))"))),
        Mutant("norm_on_branch", Pitfall.GENERAL, N_("PreNormBlock normalises the branch output"),
               N_("your block is x + norm1(attn(x)), then + norm2(ffn(·)): the norms act on the branches' outputs, not on their "
                  "inputs."),
               N_("normalise each branch's input: x = x + attn(norm1(x)); x = x + ffn(norm2(x))"),
               edits=(("x = x + self.attn(self.norm1(x))", "x = x + self.norm1(self.attn(x))"),
                      ("return x + self.ffn(self.norm2(x))", "return x + self.norm2(self.ffn(x))"))),
        Mutant("no_residual", Pitfall.GENERAL, N_("PreNormBlock drops the attention residual"),
               N_("your block computes attn(norm1(x)) without adding x back: the residual path is cut after the attention."),
               N_("add the input back: x = x + attn(norm1(x))"),
               edits=(("x = x + self.attn(self.norm1(x))", "x = self.attn(self.norm1(x))"),)),
        Mutant("same_norm", Pitfall.GENERAL, N_("PreNormBlock uses norm1 for both sublayers"),
               N_("your feed-forward sublayer reads norm1(x): norm2 never acts, so its weights change nothing."),
               N_("normalise the feed-forward input with norm2: x + ffn(norm2(x))"),
               edits=(("return x + self.ffn(self.norm2(x))", "return x + self.ffn(self.norm1(x))"),)),
    ),
    correct=(Correct("temporaries", edits=(("x = x + self.attn(self.norm1(x))",
                                            "h = self.norm1(x)\n        x = torch.add(x, self.attn(h))"),)),
             Correct("branch_first", edits=(("return x + self.ffn(self.norm2(x))", "return self.ffn(self.norm2(x)) + x"),))),
)

POST = Family(
    task="ex04_post_block", cell="ex04_post_answer", subject="PostNormBlock",
    source=("class PostNormBlock(PreNormBlock):\n"
            "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
            "        x = self.norm1(x + self.attn(x))\n"
            "        return self.norm2(x + self.ffn(x))\n"),
    mutants=(
        Mutant("norm_on_branch", Pitfall.GENERAL, N_("PostNormBlock normalises the branch, not the residual sum"),
               N_("PostNormBlock(x) = x + norm1(attn(x)), then + norm2(ffn(·)): the norms sit on the branches."),
               N_("normalise the sum: x = norm1(x + attn(x)); x = norm2(x + ffn(x))"),
               edits=(("x = self.norm1(x + self.attn(x))", "x = x + self.norm1(self.attn(x))"),
                      ("return self.norm2(x + self.ffn(x))", "return x + self.norm2(self.ffn(x))"))),
        Mutant("pre_layout", Pitfall.GENERAL, N_("PostNormBlock computes the pre-norm layout"),
               N_("with tinytf's weights your block matches TransformerBlock(norm='pre'): the norms act on the branches' inputs."),
               N_("PostNormBlock.forward computes x = norm1(x + attn(x)); x = norm2(x + ffn(x))"),
               edits=(("x = self.norm1(x + self.attn(x))", "x = x + self.attn(self.norm1(x))"),
                      ("return self.norm2(x + self.ffn(x))", "return x + self.ffn(self.norm2(x))"))),
        Mutant("no_final_norm", Pitfall.GENERAL, N_("PostNormBlock leaves the last sum unnormalised"),
               N_("your block returns x + ffn(x) without norm2: the output is not layer-normalised (its mean per token is not 0)."),
               N_("normalise the last sum too: norm2(x + ffn(x))"),
               edits=(("return self.norm2(x + self.ffn(x))", "return x + self.ffn(x)"),)),
        Mutant("no_residual", Pitfall.GENERAL, N_("PostNormBlock drops the attention residual"),
               N_("your block computes norm1(attn(x)) without x: the residual sum before the first norm is missing."),
               N_("add the input before normalising: norm1(x + attn(x))"),
               edits=(("x = self.norm1(x + self.attn(x))", "x = self.norm1(self.attn(x))"),)),
        Mutant("norms_swapped", Pitfall.GENERAL, N_("PostNormBlock swaps norm1 and norm2"),
               N_("your block normalises the attention sum with norm2 and the feed-forward sum with norm1: each norm's weights act "
                  "on the other sublayer."),
               N_("norm1 after the attention sum, norm2 after the feed-forward sum"),
               edits=(("self.norm1(x + self.attn(x))", "self.norm2(x + self.attn(x))"),
                      ("self.norm2(x + self.ffn(x))", "self.norm1(x + self.ffn(x))"))),
    ),
    correct=(Correct("temporaries", edits=(("x = self.norm1(x + self.attn(x))", "h = x + self.attn(x)\n        x = self.norm1(h)"),)),
             Correct("branch_first", edits=(("return self.norm2(x + self.ffn(x))", "return self.norm2(self.ffn(x) + x)"),))),
)

def _train_signature(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    """The task's probe, with how many blocks the factory built counted as part of the result."""
    from ..ex04 import PROBES

    value, inputs = PROBES["ex04_train"](ns, gen)
    return {**value, "factory_calls": inputs["factory_calls"]}, inputs


TRAIN = Family(
    task="ex04_train", cell="ex04_train_answer", subject="train_curve",
    source=("def train_curve(block_factory: Callable[[], nn.Module], *, steps: int, lr: float, seed: int) -> dict[str, list[float]]:\n"
            "    torch.manual_seed(seed)\n"
            "    model = SequenceModel(block_factory).to(DEVICE)\n"
            "    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)\n"
            "    data = torch.Generator().manual_seed(seed)\n"
            "    curve = {\"loss\": [], \"grad_norm\": []}\n"
            "    for _ in tqdm(range(steps), desc=f\"lr={lr:g}\", leave=False):\n"
            "        stats = tinytf.train_step(model, optimizer, make_batch(data).to(DEVICE), clip=None)\n"
            "        curve[\"loss\"].append(stats[\"loss\"])\n"
            "        curve[\"grad_norm\"].append(stats[\"grad_norm\"])\n"
            "    return curve\n"),
    mutants=(
        Mutant("unseeded", Pitfall.GENERAL, N_("train_curve is not reproducible"),
               N_("two runs with the same seed give different curves: the model's initial weights come from whatever random "
                  "state the notebook is in."),
               N_("call torch.manual_seed(seed) before building the model, and draw the batches from "
                  "torch.Generator().manual_seed(seed)"),
               edits=(("    torch.manual_seed(seed)\n", ""),)),
        Mutant("one_step_short", Pitfall.GENERAL, N_("train_curve runs one step too few"),
               N_("your curves hold steps - 1 values: the loop runs range(steps - 1)."),
               N_("loop over range(steps): one loss and one gradient norm per step"),
               edits=(("range(steps)", "range(steps - 1)"),)),
        Mutant("one_step_more", Pitfall.GENERAL, N_("train_curve runs one step too many"),
               N_("your curves hold steps + 1 values: the loop runs range(steps + 1)."),
               N_("loop over range(steps): one loss and one gradient norm per step"),
               edits=(("range(steps)", "range(steps + 1)"),)),
        Mutant("own_blocks", Pitfall.GENERAL, N_("train_curve ignores block_factory"),
               N_("your model is built from tinytf.TransformerBlock whatever block_factory is: the block being compared is never "
                  "trained."),
               N_("build the model from the factory it is given: SequenceModel(block_factory)"),
               edits=(("model = SequenceModel(block_factory)",
                       "model = SequenceModel(lambda: tinytf.TransformerBlock(DIM, HEADS, TOKENS))"),)),
        Mutant("tensor_values", Pitfall.GENERAL, N_("train_curve stores tensors, not floats"),
               N_("your curves hold one-element tensors; each entry must be a float (stats['loss'] is one already)."),
               N_("append the floats train_step returns: curve['loss'].append(stats['loss'])"),
               edits=(('curve["loss"].append(stats["loss"])', 'curve["loss"].append(torch.tensor(stats["loss"]))'),)),
    ),
    correct=(Correct("manual_loop", edits=(('    for _ in tqdm(range(steps), desc=f"lr={lr:g}", leave=False):\n',
                                            "    for _ in range(steps):\n"),)),
             Correct("lists_after", edits=(('curve["grad_norm"].append(stats["grad_norm"])',
                                            'curve["grad_norm"] = curve["grad_norm"] + [float(stats["grad_norm"])]'),))),
    signature=_train_signature,
)


def _describe_curves(ns: dict[str, Any], gen: torch.Generator) -> tuple[Any, dict[str, Any]]:
    """What the comparison's ``curves`` are: their keys, each curve's keys and length, whether a run learned, and whether
    the post-norm runs repeat the pre-norm ones."""
    curves, steps = ns["curves"], ns["STEPS"]
    out: dict[str, Any] = {"keys": sorted(repr(k) for k in curves) if isinstance(curves, dict) else type(curves).__name__}
    for key, c in (curves.items() if isinstance(curves, dict) else ()):
        loss = c.get("loss") if isinstance(c, dict) else None
        out[repr(key)] = {"keys": sorted(c) if isinstance(c, dict) else None, "steps": len(loss) if isinstance(loss, list) else None,
                          "learned": bool(isinstance(loss, list) and loss and min(loss) < 0.8 * loss[0]), "full": len(loss or []) == steps}
    lrs = (ns["LR_HIGH"], ns["LR_LOW"])
    out["post_is_pre"] = isinstance(curves, dict) and any(
        ("pre", lr) in curves and ("post", lr) in curves and curves[("pre", lr)] == curves[("post", lr)] for lr in lrs)
    return out, {"steps": steps}


def _curves(change: Any) -> Any:
    def bind(ns: dict[str, Any]) -> dict[str, Any]:
        return {"curves": change(dict(ns["curves"]), ns)}
    return bind


def _same_block(curves: dict, ns: dict[str, Any]) -> dict:
    return {key: curves[("pre", key[1])] if key[0] == "post" and ("pre", key[1]) in curves else c for key, c in curves.items()}


COMPARISON = Family(
    task="ex04_comparison", cell="ex04_compare_answer", subject="curves",
    source=("curves = {}\n"
            "blocks = {\"pre\": PreNormBlock, \"post\": PostNormBlock}\n"
            "for lr in (LR_HIGH, LR_LOW):\n"
            "    for layout, cls in blocks.items():\n"
            "        curves[(layout, lr)] = train_curve(lambda cls=cls: cls(DIM, HEADS, TOKENS), steps=STEPS, lr=lr, seed=0)\n"),
    mutants=(
        Mutant("key_order", Pitfall.GENERAL, N_("curves are keyed (lr, layout)"),
               N_("your curves' keys are (learning rate, layout) pairs; the cells below read curves[(layout, lr)]."),
               N_("key each curve by (layout, lr), e.g. curves[('pre', LR_HIGH)]"),
               bind=_curves(lambda c, ns: {(k[1], k[0]) if isinstance(k[0], str) else k: v for k, v in c.items()})),
        Mutant("one_lr", Pitfall.GENERAL, N_("curves hold one learning rate only"),
               N_("your curves hold the runs at LR_HIGH only; the comparison needs both layouts at LR_HIGH and LR_LOW."),
               N_("loop over both learning rates: for lr in (LR_HIGH, LR_LOW)"),
               bind=_curves(lambda c, ns: {k: v for k, v in c.items() if k[-1] != ns["LR_LOW"]})),
        Mutant("same_block", Pitfall.GENERAL, N_("the post-norm runs train PreNormBlock"),
               N_("your curves for 'post' are exactly those for 'pre' at the same learning rate: the same block was trained twice."),
               N_("build PostNormBlock for the 'post' runs: cls(DIM, HEADS, TOKENS) with cls from the layout"), bind=_curves(_same_block)),
        Mutant("short_runs", Pitfall.GENERAL, N_("curves are shorter than STEPS"),
               N_("your curves hold fewer than STEPS = {steps} values per run."),
               N_("train every run for steps=STEPS"), facts=lambda value, inputs: {"steps": inputs["steps"]},
               bind=_curves(lambda c, ns: {k: {n: list(x)[: ns["STEPS"] // 2] for n, x in v.items()} for k, v in c.items()})),
        Mutant("loss_only", Pitfall.GENERAL, N_("curves lack the gradient norms"),
               N_("your curves hold 'loss' only; each run needs {'loss': [...], 'grad_norm': [...]} as train_curve returns it."),
               N_("store train_curve's result as it is"),
               bind=_curves(lambda c, ns: {k: {"loss": v["loss"]} for k, v in c.items()})),
    ),
    correct=(Correct("dict_comprehension", bind=_curves(lambda c, ns: {k: {"loss": list(v["loss"]), "grad_norm": list(v["grad_norm"])}
                                                                        for k, v in c.items()})),
             Correct("reordered", bind=_curves(lambda c, ns: dict(reversed(list(c.items())))))),
    signature=_describe_curves,
)

FAMILIES = (PRE, POST, TRAIN, COMPARISON)
