"""Checkpoints that keep the whole architecture: config + weights (+ optimizer, scheduler, step, extra).

The weights alone do not say how they are wired: a post-norm and a pre-norm model have the same
parameter names and shapes, so a post-norm ``state_dict`` loads into a pre-norm model with
``strict=True`` and silently computes something else. A checkpoint therefore carries the full
:class:`tinytf.ModelConfig` next to the weights. The file is plain data for ``torch.save``:

    {"format": "tinytf.checkpoint", "version": 1, "config": {...}, "model": state_dict,
     "optimizer": ..., "scheduler": ..., "step": int, "extra": {...}}   # optimizer/scheduler/step when given

so ``torch.load(path, weights_only=True)`` reads it (a checkpoint cannot run code when loaded).
An older hand-written ``{"config": model.config.to_dict(), "model": state_dict, ...}`` file loads too;
config fields it lacks take their defaults.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import zipfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .config import ModelConfig
from .lm import TinyLanguageModel

__all__ = ["Checkpoint", "save_checkpoint", "load_checkpoint", "FORMAT", "VERSION"]

FORMAT = "tinytf.checkpoint"
VERSION = 1
_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.Size)


@dataclass
class Checkpoint:
    """What :func:`load_checkpoint` returns. ``model`` is the restored model (a new one is in
    training mode, like any new module: call ``.eval()`` before comparing outputs); the states are
    ``None`` when the checkpoint was saved without an optimizer or scheduler."""

    model: TinyLanguageModel
    config: ModelConfig
    step: int | None
    optimizer_state: dict[str, Any] | None
    scheduler_state: dict[str, Any] | None
    extra: dict[str, Any]
    path: Path


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    *,
    step: int | None = None,
    **extra: Any,
) -> Path:
    """Write ``model.config``, ``model.state_dict()`` and, when given, the optimizer and scheduler
    states, ``step`` and ``extra`` (tensors, numbers, strings, None and lists/dicts of them) to
    ``path``. The file appears atomically (a temporary file in the same folder, then ``os.replace``)
    with mode 0644: a crash mid-write never leaves a half-written checkpoint. Returns the path."""
    path = Path(path)
    config = _config_of(model, "save_checkpoint(path, model)")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ValueError(f"save_checkpoint: step must be a non-negative int (the number of steps taken), got {step!r}")
    payload: dict[str, Any] = {"format": FORMAT, "version": VERSION, "config": config.to_dict(), "model": model.state_dict()}
    if optimizer is not None:
        payload["optimizer"] = optimizer.state_dict()
    if scheduler is not None:
        payload["scheduler"] = scheduler.state_dict()
    if step is not None:
        payload["step"] = step
    payload["extra"] = dict(extra)
    for key in ("optimizer", "scheduler"):
        if key in payload:
            _check_plain(payload[key], f"the {key} state")
    for key, value in extra.items():
        _check_plain(value, f"extra {key}=")
    _write_atomically(path, payload)
    return path


def load_checkpoint(
    path: str | os.PathLike,
    *,
    map_location: Any = None,
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
) -> Checkpoint:
    """Read a :func:`save_checkpoint` file and restore it.

    Without ``model`` a new :class:`TinyLanguageModel` is built from the saved config, on the device
    the weights load to (``map_location``). With ``model`` its config must equal the saved one (a
    ``ValueError`` names every differing field). ``optimizer``/``scheduler``, built by you over that
    model (both built before loading: a scheduler's constructor resets the learning rate), get their
    saved states. Everything is read and checked first, so an unreadable, corrupted or mismatched
    file raises a ``ValueError`` naming ``path`` and leaves your model, optimizer and scheduler as they were.
    """
    path = Path(path)
    raw = _read(path, map_location)
    config = _parse(raw, path)
    if model is not None:
        _check_same_config(_config_of(model, "load_checkpoint(model=...)"), config, path)
    target = model if model is not None else TinyLanguageModel(config)
    _check_state_dict(raw["model"], target, path)
    for key, obj in (("optimizer", optimizer), ("scheduler", scheduler)):
        if obj is not None and not isinstance(raw.get(key), dict):
            raise ValueError(f"{path} holds no {key} state to restore: it was saved without one (pass {key}= to save_checkpoint)")
    if optimizer is not None:
        _check_optimizer_state(raw["optimizer"], optimizer, path)
    if scheduler is not None:
        _check_scheduler_state(raw["scheduler"], scheduler, path)
    # everything checked: only now touch the caller's objects
    if model is None:
        target.to(next(iter(raw["model"].values())).device)
    target.load_state_dict(raw["model"], strict=True)
    if optimizer is not None:
        optimizer.load_state_dict(raw["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(raw["scheduler"])
    return Checkpoint(target, config, raw.get("step"), raw.get("optimizer"), raw.get("scheduler"), raw["extra"], path)


# ---- helpers --------------------------------------------------------------------------------------


def _config_of(model: Any, where: str) -> ModelConfig:
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig):
        raise ValueError(
            f"{where} needs a tinytf.TinyLanguageModel (its .config is saved with the weights), got "
            f"{type(model).__name__}; for any other module use torch.save(module.state_dict(), path)"
        )
    return config


def _check_plain(value: Any, where: str) -> None:
    """Raise unless ``value`` is made of what ``torch.load(weights_only=True)`` reads back."""
    if isinstance(value, torch.Tensor) or type(value) in _PLAIN:
        return
    if type(value) in (list, tuple):
        for item in value:
            _check_plain(item, where)
        return
    if type(value) is dict:
        for k, item in value.items():
            _check_plain(k, where)
            _check_plain(item, where)
        return
    raise ValueError(
        f"save_checkpoint: {where} holds a {type(value).__name__} ({value!r:.60}); a checkpoint holds only tensors, "
        "numbers, strings, bools, None and lists/tuples/dicts of them, so that torch.load(weights_only=True) can read it. "
        "Convert it first (e.g. a Path to str, a numpy array to torch.tensor)."
    )


def _write_atomically(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)  # atomic on POSIX and Windows: readers see the old file or the new one
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _read(path: Path, map_location: Any) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()  # checks every entry's stored CRC-32: torch.load alone would not
    except Exception as err:  # noqa: BLE001 - any failure here means the file cannot be a checkpoint
        raise ValueError(
            f"{path} is not a readable checkpoint ({type(err).__name__}: {err}): it is truncated (an unfinished "
            "write or copy) or not a file written by torch.save / tinytf.save_checkpoint"
        ) from err
    if bad is not None:
        raise ValueError(f"{path} is corrupted: the bytes of its entry {bad!r} do not match their checksum; use another copy")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # noqa: BLE001
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ValueError(f"{path} could not be loaded with torch.load(weights_only=True): {type(err).__name__}: {first}") from err


def _parse(raw: Any, path: Path) -> ModelConfig:
    """Check the layout of a loaded checkpoint and return its config."""
    legacy = isinstance(raw, dict) and "format" not in raw and isinstance(raw.get("config"), dict) and "model" in raw
    if legacy:  # {"config": model.config.to_dict(), "model": ..., ...} as written by hand before this module
        raw.update(format=FORMAT, version=1)
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        keys = sorted(map(str, raw))[:8] if isinstance(raw, dict) else type(raw).__name__
        raise ValueError(
            f"{path} is not a tinytf checkpoint (no 'format': {FORMAT!r} entry; it holds {keys}). "
            "tinytf.load_checkpoint reads files written by tinytf.save_checkpoint; read others with torch.load."
        )
    version = raw.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= VERSION:
        raise ValueError(f"{path} has checkpoint format version {version!r}; this tinytf reads versions 1 to {VERSION}: upgrade tinytf")
    try:
        config = ModelConfig.from_dict(raw.get("config"))
    except ValueError as err:
        raise ValueError(f"{path} holds an invalid model config: {err}") from err
    state = raw.get("model")
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path} holds no model state_dict (a dict of tensors) under 'model'")
    step = raw.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise ValueError(f"{path} holds a step that is not an int: {step!r}")
    if not isinstance(raw.get("extra", {}), dict):
        raise ValueError(f"{path} holds 'extra' that is not a dict")
    raw.setdefault("extra", {})
    return config


def _check_same_config(mine: ModelConfig, saved: ModelConfig, path: Path) -> None:
    diff = [f"{f.name}: checkpoint {getattr(saved, f.name)!r}, model {getattr(mine, f.name)!r}"
            for f in fields(ModelConfig) if getattr(saved, f.name) != getattr(mine, f.name)]
    if diff:
        raise ValueError(
            f"{path} was saved from a different architecture than model= ({'; '.join(diff)}). Load it without "
            "model= to get a model built from its own config, or build yours with TinyLanguageModel.from_config(...)."
        )


def _check_state_dict(state: dict[str, torch.Tensor], model: nn.Module, path: Path) -> None:
    """The checks of ``load_state_dict(strict=True)``, made before anything is copied."""
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong = [f"{k}: checkpoint {list(state[k].shape)}, model {list(v.shape)}" for k, v in expected.items()
             if k in state and state[k].shape != v.shape]
    if missing or unexpected or wrong:
        raise ValueError(
            f"{path}: the saved weights do not fit the model (missing {missing[:5]}, unexpected {unexpected[:5]}, "
            f"wrong shapes {wrong[:5]}); the file may have been edited or written by different code"
        )


def _check_optimizer_state(state: dict[str, Any], optimizer: torch.optim.Optimizer, path: Path) -> None:
    """The checks of ``Optimizer.load_state_dict`` plus the shapes of the per-parameter state."""
    saved_groups = state.get("param_groups")
    if not isinstance(saved_groups, list) or not isinstance(state.get("state"), dict):
        raise ValueError(f"{path}: the optimizer state is malformed (no 'param_groups' list and 'state' dict)")
    sizes = [len(g.get("params", [])) for g in saved_groups]
    mine = [len(g["params"]) for g in optimizer.param_groups]
    if sizes != mine:
        raise ValueError(
            f"{path}: the saved optimizer had parameter groups of sizes {sizes}, yours has {mine}: build the "
            "optimizer over model.parameters() of the same architecture, with the same groups"
        )
    params = dict(zip((i for g in saved_groups for i in g["params"]), (p for g in optimizer.param_groups for p in g["params"])))
    for i, entry in state["state"].items():
        p = params.get(i)
        for name, value in entry.items() if isinstance(entry, dict) else ():
            if p is not None and isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != p.shape:
                raise ValueError(
                    f"{path}: the optimizer state {name!r} of parameter {i} is {list(value.shape)}, the parameter is {list(p.shape)}"
                )


def _check_scheduler_state(state: dict[str, Any], scheduler: Any, path: Path) -> None:
    """Per-group lists of the saved scheduler must match yours (``LambdaLR.load_state_dict`` fails half-way otherwise)."""
    mine = scheduler.state_dict()
    for key in ("base_lrs", "lr_lambdas"):
        if key in state and key in mine and len(state[key]) != len(mine[key]):
            raise ValueError(
                f"{path}: the saved scheduler has {len(state[key])} {key}, yours has {len(mine[key])}: "
                "build the same scheduler over an optimizer with the same parameter groups"
            )
