"""Exercise 7's mutants: the grow-by-concatenation KV cache, one cached attention step, two cached generation steps
(see :mod:`.`)."""

from __future__ import annotations

from tinytf.checks import Pitfall

from ....translation import N_
from . import Correct, Family, Mutant

_K_CAT = "self.k[layer] = torch.cat([self.k[layer], k_new], dim=2)"
_V_CAT = "self.v[layer] = torch.cat([self.v[layer], v_new], dim=2)"

CACHE = Family(
    task="ex07_cache", cell="ex07_cache_code", subject="SimpleKVCache",
    source=("class SimpleKVCache:\n"
            "    def __init__(self, layers: int) -> None:\n"
            "        self.k = [None] * layers\n"
            "        self.v = [None] * layers\n"
            "\n"
            "    @property\n"
            "    def lengths(self) -> list[int]:\n"
            "        return [0 if k is None else k.size(2) for k in self.k]\n"
            "\n"
            "    @property\n"
            "    def seen(self) -> int:\n"
            "        return min(self.lengths)\n"
            "\n"
            "    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:\n"
            "        if self.k[layer] is None:\n"
            "            self.k[layer], self.v[layer] = k_new, v_new\n"
            "        else:\n"
            f"            {_K_CAT}\n"
            f"            {_V_CAT}\n"
            "        return self.k[layer], self.v[layer]\n"),
    mutants=(
        Mutant("v_overwritten", Pitfall.KV_CACHE, N_("update overwrites v instead of appending"),
               N_("your cache keeps every key but only the newest values: v[layer] = v_new replaces what was cached."),
               N_("append the values too: v[layer] = torch.cat([v[layer], v_new], dim=2)"),
               edits=((_V_CAT, "self.v[layer] = v_new"),)),
        Mutant("head_axis", Pitfall.ORIENTATION, N_("update concatenates along the wrong axis"),
               N_("your cache appends along dim 1, the heads: k and v are [B, H, T, d_head], so time is dim 2."),
               N_("append along time: torch.cat([k[layer], k_new], dim=2) (k, v are [B, H, T, d_head])"),
               edits=((_K_CAT, _K_CAT.replace("dim=2", "dim=1")), (_V_CAT, _V_CAT.replace("dim=2", "dim=1")))),
        Mutant("prepended", Pitfall.KV_CACHE, N_("update puts the new entries before the old ones"),
               N_("your cache returns the new keys and values first, then the cached ones: positions come out in the wrong "
                  "order."),
               N_("old first, then new: torch.cat([k[layer], k_new], dim=2)"),
               edits=((_K_CAT, "self.k[layer] = torch.cat([k_new, self.k[layer]], dim=2)"),
                      (_V_CAT, "self.v[layer] = torch.cat([v_new, self.v[layer]], dim=2)"))),
        Mutant("aliased_lists", Pitfall.GENERAL, N_("the cache's k and v are one list"),
               N_("your cache's self.k and self.v are the same list object: writing v[layer] overwrites the keys just stored."),
               N_("make two lists: self.k = [None] * layers; self.v = [None] * layers"),
               edits=(("        self.v = [None] * layers\n", "        self.v = self.k\n"),)),
        Mutant("returns_new", Pitfall.KV_CACHE, N_("update returns only the new entries"),
               N_("your update stores everything but returns k_new and v_new: a decode step then attends to the new token only."),
               N_("return everything cached for that layer: return k[layer], v[layer]"),
               edits=(("return self.k[layer], self.v[layer]", "return k_new, v_new"),)),
        Mutant("lengths_heads", Pitfall.GENERAL, N_("the cache's lengths count heads"),
               N_("your lengths read k.size(1), the number of heads; the cached tokens are k.size(2)."),
               N_("count the time axis: k.size(2)"), edits=(("else k.size(2) for k in self.k", "else k.size(1) for k in self.k"),)),
    ),
    correct=(Correct("negative_dim", edits=((_K_CAT, _K_CAT.replace("dim=2", "dim=-2")), (_V_CAT, _V_CAT.replace("dim=2", "dim=-2")))),
             Correct("shape_lengths", edits=(("else k.size(2) for k in self.k", "else k.shape[-2] for k in self.k"),))),
)

_MASK = "allowed = tinytf.causal_mask(t, k_all.size(2), device=x_new.device)"
_SCORES = "scores = (q @ k_all.transpose(-2, -1)) / math.sqrt(attn.head_dim)"
END_ALIGNED = N_("use tinytf.causal_mask(t, past + t): END-aligned, query i sits at position past + i and reads keys 0 … past + i")

STEP = Family(
    task="ex07_step", cell="ex07_step_code", subject="attention_step",
    source=("def attention_step(attn: tinytf.CausalSelfAttention, x_new: torch.Tensor, cache: \"SimpleKVCache | tinytf.KVCache\", "
            "layer: int = 0) -> torch.Tensor:\n"
            "    b, t, dim = x_new.shape\n"
            "    q, k, v = attn.qkv(x_new).chunk(3, dim=-1)\n"
            "    q, k, v = (z.view(b, t, attn.heads, attn.head_dim).transpose(1, 2) for z in (q, k, v))\n"
            "    k_all, v_all = cache.update(layer, k, v)\n"
            f"    {_MASK}\n"
            f"    {_SCORES}\n"
            "    weights = scores.masked_fill(~allowed, float(\"-inf\")).softmax(dim=-1)\n"
            "    out = (weights @ v_all).transpose(1, 2).reshape(b, t, dim)\n"
            "    return attn.proj(out)\n"),
    mutants=(
        Mutant("own_key_blocked", Pitfall.CAUSAL_OFF_BY_ONE, N_("attention_step's mask blocks each query's own key"),
               N_("your mask lets the query at position past + i see keys 0 … past + i - 1: one diagonal too low, so the first "
                  "prompt token sees nothing (NaN) and every other misses its own key."), END_ALIGNED,
               edits=((_MASK, "allowed = torch.ones(t, k_all.size(2), dtype=torch.bool, device=x_new.device)"
                              ".tril(k_all.size(2) - t - 1)"),)),
        Mutant("start_aligned", Pitfall.CAUSAL_OFF_BY_ONE, N_("attention_step's causal mask is START-aligned"),
               N_("your mask lets new token i see keys 0 … i, counted from the start of the cache: after cached tokens each new "
                  "token loses the last past keys it may see."), END_ALIGNED,
               edits=((_MASK, "allowed = torch.ones(t, k_all.size(2), dtype=torch.bool, device=x_new.device).tril()"),)),
        Mutant("square_mask", Pitfall.GENERAL, N_("attention_step's mask ignores the cached tokens"),
               N_("your mask is causal_mask(t), [t, t]: it fits the scores [t, past + t] only when nothing is cached or t = 1, so "
                  "several new tokens after cached ones fail (e.g. 2 new tokens after 3 cached ones need a [2, 5] mask, END-aligned)."),
               END_ALIGNED, edits=((_MASK, "allowed = tinytf.causal_mask(t, device=x_new.device)"),)),
        Mutant("no_mask", Pitfall.CAUSAL_OFF_BY_ONE, N_("attention_step has no causal mask"),
               N_("your prompt tokens see the tokens after them: at prefill every query reads every key."), END_ALIGNED,
               edits=(('weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)', "weights = scores.softmax(dim=-1)"),)),
        Mutant("model_width_scale", Pitfall.SCALE, N_("attention_step scales by the model width"),
               N_("your scores are divided by sqrt(D) = sqrt({dim}), the model width; a head's scores are divided by sqrt(d_head)."),
               N_("divide by math.sqrt(attn.head_dim)"),
               facts=lambda value, inputs: {"dim": inputs["x"].size(-1)},
               edits=(("math.sqrt(attn.head_dim)", "math.sqrt(dim)"),)),
        Mutant("cache_unused", Pitfall.KV_CACHE, N_("attention_step attends to the new tokens only"),
               N_("your step updates the cache but attends with the new k and v: a decode step sees itself only, not the cached "
                  "tokens."),
               N_("attend with what cache.update returns: q @ k_all.transpose(-2, -1), then weights @ v_all"),
               edits=((_SCORES, "scores = (q @ k.transpose(-2, -1)) / math.sqrt(attn.head_dim)"),
                      (_MASK, "allowed = tinytf.causal_mask(t, t, device=x_new.device)"),
                      ("(weights @ v_all)", "(weights @ v)"))),
        Mutant("no_proj", Pitfall.GENERAL, N_("attention_step skips the output projection"),
               N_("your step returns the merged heads: attn.proj is never applied."), N_("return attn.proj(out)"),
               edits=(("    return attn.proj(out)", "    return out"),)),
    ),
    correct=(Correct("sdpa_mask", edits=(('weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)', "weights = None"),
                                         ("(weights @ v_all)", "tinytf.scaled_dot_product_attention(q, k_all, v_all, allowed)"))),
             Correct("arange_mask", edits=((_MASK, "allowed = torch.arange(t)[:, None] + (k_all.size(2) - t) >= "
                                                   "torch.arange(k_all.size(2))[None, :]"),))),
)

_STEP2 = "logits2 = model(tok1, cache=cache)[:, -1]"

GENERATE = Family(
    task="ex07_generate", cell="ex07_generate_code", subject="generate_two_step",
    source=("@torch.no_grad()\n"
            "def generate_two_step(model: tinytf.TinyLanguageModel, prompt: torch.Tensor, cache: \"SimpleKVCache | tinytf.KVCache\") "
            "-> tuple[torch.Tensor, torch.Tensor]:\n"
            "    logits1 = model(prompt, cache=cache)[:, -1]\n"
            "    tok1 = logits1.argmax(dim=-1, keepdim=True)\n"
            f"    {_STEP2}\n"
            "    tok2 = logits2.argmax(dim=-1, keepdim=True)\n"
            "    return torch.cat([prompt, tok1, tok2], dim=1), torch.stack([logits1, logits2], dim=1)\n"
            "\n"
            "\n"
            "@torch.no_grad()\n"
            "def generate_two_step_recompute(model: tinytf.TinyLanguageModel, prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:\n"
            "    ids, steps = prompt, []\n"
            "    for _ in range(2):\n"
            "        logits = model(ids)[:, -1]\n"
            "        steps.append(logits)\n"
            "        ids = torch.cat([ids, logits.argmax(dim=-1, keepdim=True)], dim=1)\n"
            "    return ids, torch.stack(steps, dim=1)\n"),
    mutants=(
        Mutant("prefix_again", Pitfall.KV_CACHE, N_("step 2 feeds more than the new token"),
               N_("your step 2 feeds the prompt and the new token to a cache that holds the prompt already: the prompt is cached "
                  "twice and its positions shift."),
               N_("feed only the token chosen in step 1: model(tok1, cache=cache)"),
               edits=((_STEP2, "logits2 = model(torch.cat([prompt, tok1], dim=1), cache=cache)[:, -1]"),)),
        Mutant("no_cache_step2", Pitfall.KV_CACHE, N_("step 2 runs without the cache"),
               N_("your step 2 runs model(tok1) without cache=cache: the new token sees no prompt at all."),
               N_("pass the cache again in step 2: model(tok1, cache=cache)"),
               edits=((_STEP2, "logits2 = model(tok1)[:, -1]"),)),
        Mutant("first_position", Pitfall.GENERAL, N_("generate_two_step reads the first position's logits"),
               N_("your step 1 takes logits[:, 0], the prediction after the first prompt token; the next token follows the "
                  "last one, logits[:, -1]."),
               N_("take the last position's logits: model(prompt, cache=cache)[:, -1]"),
               edits=(("logits1 = model(prompt, cache=cache)[:, -1]", "logits1 = model(prompt, cache=cache)[:, 0]"),)),
        Mutant("step1_logits_twice", Pitfall.GENERAL, N_("generate_two_step picks token 2 from step 1's logits"),
               N_("your second token is logits1.argmax again: token 2 repeats token 1 instead of following from step 2's logits."),
               N_("pick token 2 from step 2: tok2 = logits2.argmax(dim=-1, keepdim=True)"),
               edits=(("tok2 = logits2.argmax(dim=-1, keepdim=True)", "tok2 = logits1.argmax(dim=-1, keepdim=True)"),)),
        Mutant("ids_without_prompt", Pitfall.GENERAL, N_("generate_two_step returns the new tokens only"),
               N_("your ids are [B, 2], the two new tokens; the result is the prompt followed by them, [B, T + 2]."),
               N_("return torch.cat([prompt, tok1, tok2], dim=1)"),
               edits=(("return torch.cat([prompt, tok1, tok2], dim=1)", "return torch.cat([tok1, tok2], dim=1)"),)),
        Mutant("recompute_not_extended", Pitfall.GENERAL, N_("generate_two_step_recompute is wrong"),
               N_("your recomputation never appends the chosen token: step 2 runs on the prompt again and repeats step 1."),
               N_("append each chosen token: ids = torch.cat([ids, logits.argmax(dim=-1, keepdim=True)], dim=1)"),
               edits=(("        ids = torch.cat([ids, logits.argmax(dim=-1, keepdim=True)], dim=1)\n", ""),)),
    ),
    correct=(Correct("last_slice", edits=(("logits1 = model(prompt, cache=cache)[:, -1]",
                                           "logits1 = model(prompt, cache=cache)[:, -1:].squeeze(1)"),)),
             Correct("select", edits=((_STEP2, "logits2 = model(tok1, cache=cache).select(1, -1)"),))),
)

FAMILIES = (CACHE, STEP, GENERATE)
