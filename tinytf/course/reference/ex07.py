"""Exercise 7 — a simple KV cache and a two-step generation loop: judges and the self-check.

Student code: ``SimpleKVCache(layers)`` with ``update(layer, k_new, v_new) -> (k, v)``, ``lengths``,
``seen``; ``attention_step(attn, x_new, cache, layer=0)`` (one cached step of a
``tinytf.CausalSelfAttention``); ``generate_two_step(model, prompt, cache)`` and
``generate_two_step_recompute(model, prompt)`` -> ``(ids [B, T + 2], logits [B, 2, V])``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from tinytf.checks import Finding, Pitfall, found

from ...translation import N_, gettext
from ...translation import gettext as _
from . import call_student, check_parts, explained, flat
from .ex07_probes import PROBES
from .judging import judge
from .validators import close, has_keys, how_off, shape_of, shapes, should_be, tensor

__all__ = ["reference_two_step", "diagnose", "diagnose_tasks", "PROBES"]


def reference_two_step(model: torch.nn.Module, prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two greedy steps recomputing the prefix: ``(ids [B, T + 2], logits [B, 2, V])``."""
    ids, steps = prompt, []
    with torch.no_grad():
        for _ in range(2):
            logits = model(ids)[:, -1]
            steps.append(logits)
            ids = torch.cat([ids, logits.argmax(dim=-1, keepdim=True)], dim=1)
    return ids, torch.stack(steps, dim=1)


def _attn(x: torch.Tensor, heads: int, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor,
          proj_weight: torch.Tensor, proj_bias: torch.Tensor) -> torch.nn.Module:
    from tinytf import CausalSelfAttention

    attn = CausalSelfAttention(x.size(-1), int(heads), max_tokens=x.size(1))
    attn.load_state_dict({"qkv.weight": qkv_weight, "qkv.bias": qkv_bias, "proj.weight": proj_weight, "proj.bias": proj_bias})
    return attn.eval()


# ---- judges ---------------------------------------------------------------------------------------


@judge("ex07_cache")
def _judge_cache(value: Any, layers: int, writes: list[dict[str, Any]]) -> None:
    has_keys(value, ("returned", "lengths"))
    returned = value["returned"]
    assert isinstance(returned, list) and len(returned) == len(writes), _("one (k, v) per update call")
    k_ref: list[torch.Tensor | None] = [None] * int(layers)
    v_ref: list[torch.Tensor | None] = [None] * int(layers)
    for i, (w, got) in enumerate(zip(writes, returned)):
        layer = int(w["layer"])
        k_ref[layer] = w["k"] if k_ref[layer] is None else torch.cat([k_ref[layer], w["k"]], dim=2)
        v_ref[layer] = w["v"] if v_ref[layer] is None else torch.cat([v_ref[layer], w["v"]], dim=2)
        has_keys(got, ("k", "v"), _("the record of update #{value}").format(value=i + 1))
        for key, ref in (("k", k_ref[layer]), ("v", v_ref[layer])):
            t = tensor(got[key], ref.shape, _("update #{value} returned {key}").format(value=i + 1, key=key), dtype=None)
            assert torch.equal(t, ref), (_("update #{n}: the returned {key} is not the old entries followed by the new ones "
                                           "(dim=2)").format(n=i + 1, key=key))
    lengths = [0 if k is None else k.size(2) for k in k_ref]
    got = list(value["lengths"])
    wrong = next(((i, g, w) for i, (g, w) in enumerate(zip(got, lengths)) if g != w), None)
    off = how_off(wrong[1], wrong[2], step=(_("token"), 1)) if wrong else ""
    how = _(" (layer {layer}{off})").format(layer=wrong[0], off=off) if off else ""
    assert got == lengths, _("lengths should be {lengths}, got {value}").format(lengths=lengths, value=value['lengths']) + how


@judge("ex07_step")
def _judge_step(value: Any, x: torch.Tensor, prefill: int, heads: int, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor,
                proj_weight: torch.Tensor, proj_bias: torch.Tensor) -> None:
    attn = _attn(x, heads, qkv_weight, qkv_bias, proj_weight, proj_bias)
    with torch.no_grad():
        expected = attn(x.float())
    got = tensor(value, expected.shape, _("the concatenated cached outputs"))
    close(got, expected, _("cached attention"), atol=1e-4, reference=_("recomputing the full sequence"),
          given=shapes(x=x, heads=int(heads), prefill=int(prefill)))


@judge("ex07_generate")
def _judge_generate(value: Any, prompt: torch.Tensor, config: dict[str, int], state_dict: dict[str, torch.Tensor]) -> None:
    from tinytf import TinyLanguageModel

    has_keys(value, ("ids", "logits", "ids_recompute", "logits_recompute"))
    model = TinyLanguageModel.from_config(config)
    model.load_state_dict(state_dict)
    ids, logits = reference_two_step(model.eval(), prompt)
    for suffix, what in (("", _("generate_two_step (cached)")), ("_recompute", "generate_two_step_recompute")):
        got_logits = tensor(value[f"logits{suffix}"], logits.shape, _("{what} logits").format(what=what))
        assert torch.allclose(got_logits, logits, atol=1e-4, rtol=1e-4), (
            _("{what}: logits differ from recomputing the prefix: {should_be}").format(what=what,
                should_be=should_be(got_logits, logits, shapes(prompt=prompt))))
        got_ids = tensor(value[f"ids{suffix}"], ids.shape, _("{what} ids").format(what=what), dtype=None)
        assert torch.equal(got_ids.long(), ids), (
            _("{what}: the generated tokens differ from greedy decoding: {should_be}").format(what=what,
                should_be=should_be(got_ids, ids, shapes(prompt=prompt))))


# ---- self-check diagnosis -------------------------------------------------------------------------


def _diagnose_cache(cls: Any) -> list[Finding]:

    g = torch.Generator().manual_seed(0)
    k0, v0, k1, v1 = (torch.randn(1, 2, t, 4, generator=g) for t in (3, 3, 1, 1))
    cache, problem = call_student("SimpleKVCache(2)", cls, 2)
    if problem:
        return [problem]
    first, problem = call_student("SimpleKVCache.update", cache.update, 0, k0, v0)
    if problem:
        return [problem]
    second, problem = call_student("SimpleKVCache.update", cache.update, 0, k1, v1)
    if problem:
        if "Sizes of tensors must match" in problem.message:  # torch.cat along the wrong axis
            return [found(Pitfall.ORIENTATION, _("update concatenates along the wrong axis"),
                          _("appending 1 token to 3 failed ({problem}).").format(problem=problem.message),
                          fix=_("append along time: torch.cat([k[layer], k_new], dim=2) (k, v are [B, H, T, d_head])"))]
        return [problem]
    if not (isinstance(second, tuple) and len(second) == 2 and all(isinstance(t, torch.Tensor) for t in second)):
        return [found(Pitfall.GENERAL, _("update must return (k, v)"), _("it returned {type}.").format(type=type(second).__name__),
                      fix=_("return the two tensors of everything cached for that layer: return k[layer], v[layer]"))]
    k_all = second[0]
    if tuple(k_all.shape) == (1, 2, 1, 4):
        return [found(Pitfall.KV_CACHE, _("update returns only the new entries"),
                      _("after 3 + 1 tokens it returned [1, 2, 1, 4]: a decode step must attend over ALL cached keys."),
                      fix=_("concatenate the old and new entries, store them and return them: torch.cat([k[layer], k_new], dim=2)"))]
    if tuple(k_all.shape) != (1, 2, 4, 4):
        return [found(Pitfall.ORIENTATION, _("update concatenates along the wrong axis"),
                      _("after 3 + 1 tokens expected [1, 2, 4, 4], got {k_all_shape}.").format(k_all_shape=list(k_all.shape)),
                      fix=_("append along time: torch.cat([k[layer], k_new], dim=2) (k, v are [B, H, T, d_head])"))]
    for name, got, old, new in (("k", k_all, k0, k1), ("v", second[1], v0, v1)):
        wrong = _wrong_entries(name, got, old, new)
        if wrong:
            return [wrong]
    lengths = cache.lengths
    if list(lengths) != [4, 0]:
        return [found(Pitfall.GENERAL, _("the cache's lengths are wrong"),
                      _("after 4 tokens in layer 0 and none in layer 1 expected [4, 0], got {lengths}.").format(lengths=lengths),
                      fix=_("lengths[layer] = k[layer].size(2), 0 for a layer with nothing cached"))]
    return []


def _wrong_entries(name: str, got: Any, old: torch.Tensor, new: torch.Tensor) -> Finding | None:
    """What is wrong with the ``name`` (k or v) that update returned after 3 + 1 tokens, or None."""
    expected = torch.cat([old, new], dim=2)
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and torch.equal(got, expected):
        return None
    if isinstance(got, torch.Tensor) and got.shape == new.shape and torch.equal(got, new):
        return found(Pitfall.KV_CACHE, _("update overwrites {name} instead of appending").format(name=name),
                     _("after 3 + 1 tokens the returned {name} should be [1, 2, 4, 4] (old entries, then the new one), got only the "
                       "new entry {got_shape}.").format(name=name, got_shape=list(got.shape)),
                     fix=f"{name}[layer] = torch.cat([{name}[layer], {name}_new], dim=2)")  # code: the same in every language
    cat = f"torch.cat([{name}[layer], {name}_new], dim=2)"
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and torch.equal(got, torch.cat([new, old], dim=2)):
        return found(Pitfall.KV_CACHE, _("update puts the new {name} before the old ones").format(name=name),
                     _("time runs along dim=2, old entries first."), fix=_("{cat}: old entries first").format(cat=cat))
    return found(Pitfall.KV_CACHE, _("update returns the wrong {name}").format(name=name),
                 _("after 3 + 1 tokens {name} should be [1, 2, 4, 4] = torch.cat([old, new], dim=2) of the {name} tensors passed in "
                   "(first entries {expected_flatten_tolist}), got {got}.").format(name=name,
                       expected_flatten_tolist=expected.flatten()[:3].tolist(), got=shape_of(got)),
                 fix=_("store and return {cat}, the tensors passed in, unchanged").format(cat=cat))


# a cached step's own fix: the catalog's square ones(T, T).tril() is exactly the mask that is wrong here
_STEP_FIX = N_("use tinytf.causal_mask(t, past + t): END-aligned, [t, past + t], new token i reads keys 0 .. past + i")

_MASKS = {  # a student's causal mask [t, T] (T = past + t): (allowed(t, T), title, what it does)
    "sees_next": (lambda t, n: torch.ones(t, n, dtype=torch.bool).tril(n - t + 1), N_("the causal mask lets tokens read one key too many"),
                  N_("each token also reads the NEXT key: the diagonal is off by one")),
    "not_itself": (lambda t, n: torch.ones(t, n, dtype=torch.bool).tril(n - t - 1), N_("the causal mask hides each token's own key"),
                   N_("each token reads keys 0 .. position - 1 only: the diagonal is off by one")),
    "start": (lambda t, n: torch.ones(t, n, dtype=torch.bool).tril(0), N_("decode steps do not see the whole cache"),
              N_("the mask is START-aligned, so a decode token at position past reads only key 0; it must be END-aligned "
              "(tinytf.causal_mask(t, past + t))")),
    "none": (lambda t, n: torch.ones(t, n, dtype=torch.bool), N_("the prefill lets tokens see the future"),
             N_("no causal mask: with t > 1 new tokens each one reads the later ones too")),
}


def _masked_steps(attn: Any, x: torch.Tensor, cuts: list[int], allowed: Any) -> list[torch.Tensor]:
    """The outputs of prefill + decode steps (split at ``cuts``) of ``attn`` on ``x`` with the mask ``allowed(t, T)``."""
    q, k, v = attn.project(x)
    outs = []
    for a, b in zip(cuts, cuts[1:]):
        scores = q[:, :, a:b] @ k[:, :, :b].transpose(-2, -1) / math.sqrt(attn.head_dim)
        w = scores.masked_fill(~allowed(b - a, b), float("-inf")).softmax(-1)
        outs.append(attn.proj(attn.merge_heads(w @ v[:, :, :b])))
    return outs


def _name_step_mask(attn: Any, x: torch.Tensor, got: list[Any]) -> Finding | None:
    """The causal-mask mistake whose outputs equal the student's prefill (4 tokens) + two decode steps, if any."""
    with torch.no_grad():
        for allowed, title, meaning in _MASKS.values():
            ref = _masked_steps(attn, x, [0, 4, 5, 6], allowed)
            if all(isinstance(g, torch.Tensor) and g.shape == r.shape and torch.allclose(g, r, atol=1e-4, equal_nan=True)
                   for g, r in zip(got, ref)):
                return Finding(Pitfall.CAUSAL_OFF_BY_ONE, _(title),
                               _("{meaning}. Seen with a prefill of 4 tokens then decode steps at positions 4 and 5: the new tokens at "
                                 "absolute positions past .. past + t - 1 may read keys 0 .. their own position: tinytf.causal_mask(t, "
                                 "past + t).").format(meaning=_(meaning)), fix=_(_STEP_FIX))
    return None


def _diagnose_step(fn: Any) -> list[Finding]:
    from tinytf import CausalSelfAttention, KVCache

    torch.manual_seed(11)
    attn = CausalSelfAttention(12, 3, max_tokens=8).eval()
    x = torch.randn(2, 6, 12, generator=torch.Generator().manual_seed(12))
    cache = KVCache(1, 2, 3, 8, 4)
    with torch.no_grad():
        full = attn(x)
        pre, problem = call_student(_("attention_step (prefill)"), fn, attn, x[:, :4], cache)
        if problem:
            return [problem]
        if not isinstance(pre, torch.Tensor) or pre.shape != (2, 4, 12):
            return [found(Pitfall.ORIENTATION, _("attention_step returns the wrong shape"),
                          _("a prefill of 4 tokens should give [2, 4, 12], got {pre}.").format(pre=shape_of(pre)),
                          fix=_("merge the heads with out.transpose(1, 2).reshape(B, t, D), then attn.proj"))]
        steps = []
        for i in (4, 5):
            out, problem = call_student(_("attention_step (decode)"), fn, attn, x[:, i : i + 1], cache)
            if problem:
                return [problem]
            steps.append(out)
    pre_ok = torch.allclose(pre, full[:, :4], atol=1e-4)
    dec_ok = all(isinstance(s, torch.Tensor) and s.shape == (2, 1, 12) and torch.allclose(s, full[:, i : i + 1], atol=1e-4)
                 for s, i in zip(steps, (4, 5)))
    if pre_ok and dec_ok:
        return _diagnose_chunk(fn, attn, x, full)
    named = _name_step_mask(attn, x, [pre, *steps])
    if named:
        return [named]
    where = _("the prefill (positions 0..3)") if not pre_ok else _("the decode step at position {position}").format(
        position=4 if not torch.allclose(steps[0], full[:, 4:5], atol=1e-4) else 5)
    return [found(Pitfall.GENERAL, _("attention_step differs from the full pass"),
                  _("with a CausalSelfAttention(12, 3), x [2, 6, 12], a prefill of 4 tokens and two decode steps, {where} differs from "
                    "attn(x).").format(where=where),
                  fix=_("project only x_new with attn.qkv, split heads, cache.update(layer, k, v), scale by 1/sqrt(head_dim), mask with "
                        "tinytf.causal_mask(t, past + t), softmax over the keys, merge heads, attn.proj"))]


def _diagnose_chunk(fn: Any, attn: torch.nn.Module, x: torch.Tensor, full: torch.Tensor) -> list[Finding]:
    """A prefill of 2 tokens after 3 are cached (past > 0, t > 1): only an end-aligned mask is right there."""
    from tinytf import KVCache

    cache = KVCache(1, 2, 3, 8, 4)
    with torch.no_grad():
        _, problem = call_student(gettext("attention_step (prefill)"), fn, attn, x[:, :3], cache)
        chunk, problem = (None, problem) if problem else call_student(gettext("attention_step (2 tokens after 3 cached)"), fn, attn,
                                                                      x[:, 3:5], cache)
    if isinstance(chunk, torch.Tensor) and chunk.shape == (2, 2, 12) and torch.allclose(chunk, full[:, 3:5], atol=1e-4):
        return []
    return [Finding(Pitfall.GENERAL, gettext("attention_step is wrong for several new tokens after cached ones"),
                    gettext("a prefill and one-token decode steps are right, but 2 new tokens after 3 cached ones ({value}): the mask "
                            "must be END-aligned, [t, past + t], new token i reads keys 0..past + i: tinytf.causal_mask(t, past + t), "
                            "not causal_mask(t).").format(value=gettext("raised: {message}").format(message=problem.message) if problem
                                                      else gettext("differ from attn(x)")),
                    fix=gettext(_STEP_FIX))]


def _generation_probe() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(model, prompt, ids, logits)``: a small fixed-seed model, a prompt and the reference two steps."""
    from tinytf import TinyLanguageModel

    torch.manual_seed(13)
    model = TinyLanguageModel(vocab=23, dim=12, heads=3, layers=2, max_tokens=16).eval()
    prompt = torch.randint(0, 23, (2, 5), generator=torch.Generator().manual_seed(14))
    return (model, prompt, *reference_two_step(model, prompt))


def _same_steps(res: Any, ids: torch.Tensor, logits: torch.Tensor) -> bool:
    return isinstance(res, tuple) and len(res) == 2 and torch.equal(res[0], ids) and torch.allclose(res[1], logits, atol=1e-4)


def _diagnose_recompute(fn: Any) -> list[Finding]:
    model, prompt, ids, logits = _generation_probe()
    res, problem = call_student("generate_two_step_recompute", fn, model, prompt)
    if problem:
        return [problem]
    if not _same_steps(res, ids, logits):
        return [found(Pitfall.GENERAL, _("generate_two_step_recompute is wrong"),
                      _("its tokens or logits differ from two greedy steps that recompute the whole prefix."),
                      fix=_("run the model on the whole prefix, take logits[:, -1], argmax, append; twice"))]
    return []


def _diagnose_cached(fn: Any) -> list[Finding]:
    from tinytf import KVCache

    model, prompt, ids, logits = _generation_probe()
    cache = KVCache.for_model(model, 2)
    res, problem = call_student("generate_two_step", fn, model, prompt, cache)
    if problem:
        return [problem]
    if cache.seen > prompt.size(1) + 1:
        return [found(Pitfall.KV_CACHE, _("step 2 feeds more than the new token"),
                      _("after the loop the cache holds {cache_seen} tokens, expected {value}{how}.").format(
                          cache_seen=cache.seen, value=prompt.size(1) + 1,
                          how=how_off(cache.seen, prompt.size(1) + 1, step=(_("token"), 1))),
                      fix=_("with a cache, step 2 runs the model on the ONE token chosen in step 1: model(token[:, None], cache=cache)"))]
    if not _same_steps(res, ids, logits):
        return [found(Pitfall.GENERAL, _("generate_two_step differs from recomputing the prefix"),
                      _("its tokens or logits differ from two greedy steps that recompute the whole prefix."),
                      fix=_("prefill with model(prompt, cache=cache), argmax of the last logits, then model(token, cache=cache)"))]
    return []


def diagnose_tasks(namespace: dict[str, Any], only: Iterable[str] | None = None) -> dict[str, list[Finding]]:
    """``{grade_id: findings}`` about the student's ex07 code in ``namespace``: the named checks, the task's mutants
    (:mod:`.mutants.ex07`), then the judges on fresh inputs for every task without a finding. Never raises."""
    return explained(namespace, PROBES, {
        "ex07_cache": lambda: check_parts(namespace, [("SimpleKVCache", _diagnose_cache)]),
        "ex07_step": lambda: check_parts(namespace, [("attention_step", _diagnose_step)]),
        "ex07_generate": lambda: check_parts(namespace, [("generate_two_step_recompute", _diagnose_recompute),
                                                          ("generate_two_step", _diagnose_cached)])}, only=only)


def diagnose(namespace: dict[str, Any]) -> list[Finding]:
    """Findings about the student's ex07 code in ``namespace`` (empty when all looks right); see :func:`diagnose_tasks`."""
    return flat(diagnose_tasks(namespace))
