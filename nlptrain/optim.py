"""Optimizer parameter groups: weight decay by parameter, lr by layer, and where the layers are.

`param_groups(model, lr, config)` is the trainer's default `param_groups=` function. Every group
has a `name`, its `lr` and `weight_decay`; the names and values are saved with the optimizer's
state in checkpoints, and a resume rebuilds the same groups from the same config.

Layer-wise lr decay (`[train] layer_lr_decay = d`, LLRD): the head (classifier, pooler, anything
outside the embeddings and the encoder layers) at `lr`, the top encoder layer at `lr * d`, each
lower one times `d` again, the embeddings last at `lr * d ** (layers + 1)`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from nlptrain.errors import ConfigError

if TYPE_CHECKING:
    from nlptrain.config import TrainConfig

LAYER_LIST_NAMES = ("layer", "layers", "block", "blocks")  # BERT/RoBERTa/ELECTRA/DeBERTa, DistilBERT
# (model, lr, config) -> optimizer parameter groups, each with its "params", "lr", "weight_decay"
ParamGroupsFn = Callable[[torch.nn.Module, float, "TrainConfig"], list[dict[str, Any]]]
OptimizerFn = Callable[[list[dict[str, Any]], "TrainConfig"], torch.optim.Optimizer]


@dataclass
class EncoderLayout:
    """The embeddings and the encoder layers (bottom to top) of a transformer classifier, and
    the parameters of neither that belong with the embeddings or the top layer."""

    embeddings: torch.nn.Module
    layers: list[torch.nn.Module]
    with_embeddings: list[torch.nn.Parameter] = field(default_factory=list)
    with_top_layer: list[torch.nn.Parameter] = field(default_factory=list)

    def blocks(self) -> list[list[torch.nn.Parameter]]:
        """Each block's parameters, the embeddings', then each layer's upwards: block i sits i
        steps above the input. The head (pooler, classifier) is in none."""
        blocks = [[*self.embeddings.parameters(), *self.with_embeddings],
                  *[list(layer.parameters()) for layer in self.layers]]
        blocks[-1] += self.with_top_layer
        return blocks


def encoder_layout(model: torch.nn.Module) -> EncoderLayout:
    """Find the embeddings and the encoder's layer list of a `transformers` model (or of a module
    of your own with `embeddings` and an `encoder.layer`-like ModuleList)."""
    base = getattr(model, "base_model", model)
    embeddings = getattr(base, "embeddings", None)
    for name, module in base.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.split(".")[-1] in LAYER_LIST_NAMES:
            if embeddings is not None and len(module) > 0:
                return _with_the_rest(base, EncoderLayout(embeddings, list(module)),
                                      name.rpartition(".")[0], own=base is model)
    raise ConfigError(f"{type(model).__name__}: found no `embeddings` module and encoder layer list "
                      f"(a ModuleList named one of {', '.join(LAYER_LIST_NAMES)}); layer_lr_decay and "
                      "Freeze need them")


def _with_the_rest(base: torch.nn.Module, layout: EncoderLayout, encoder: str,
                   own: bool) -> EncoderLayout:
    """Place the base model's parameters outside the embeddings and the layers: those before
    the encoder (ELECTRA's embeddings_project) and the encoder's own shared position tables
    (DeBERTa's rel_embeddings, with their LayerNorm) feed every layer, so they go with the
    embeddings; the encoder's others (a final norm) with the top layer; those after it (the
    pooler) are the head's. In a module of your own (`own`: no `base_model` apart from its
    head) only those named for embeddings come before the encoder: a head declared first stays
    the head."""
    in_layers = {id(p) for layer in layout.layers for p in layer.parameters()}
    placed = in_layers | {id(p) for p in layout.embeddings.parameters()}
    reached_encoder = False
    inside: list[tuple[str, torch.nn.Parameter]] = []
    for name, param in base.named_parameters():
        in_encoder = bool(encoder) and name.startswith(f"{encoder}.")
        reached_encoder = reached_encoder or id(param) in in_layers or in_encoder
        if id(param) in placed:
            continue
        if in_encoder:
            inside.append((name, param))
        elif not reached_encoder and (not own or "embed" in name):
            layout.with_embeddings.append(param)
    positional = any(re.search(r"embed|rel", name[len(encoder) + 1:]) for name, _ in inside)
    for _, param in inside:
        (layout.with_embeddings if positional else layout.with_top_layer).append(param)
    return layout


def no_decay(name: str, param: torch.Tensor) -> bool:
    """Biases and normalisation weights take no weight decay."""
    return param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name


def block_of(model: torch.nn.Module, layout: EncoderLayout) -> dict[int, int]:
    """id(parameter) -> block index (0 embeddings, 1..L the layers); the head is absent."""
    return {id(param): index for index, block in enumerate(layout.blocks()) for param in block}


def param_groups(model: torch.nn.Module, lr: float, config: TrainConfig) -> list[dict[str, Any]]:
    """Groups of every parameter: decay / no decay, and one lr per layer under LLRD. A frozen
    one is held too (AdamW skips a parameter without a gradient: no update, no state, no
    decay), so one a callback unfreezes later trains."""
    decay_factor = config.layer_lr_decay
    depth: dict[int, int] = {}
    top = 0
    if decay_factor != 1.0:
        layout = encoder_layout(model)
        depth, top = block_of(model, layout), len(layout.layers) + 1
    # Without LLRD: the two groups, decay first, that checkpoints have always held.
    groups: dict[str, dict[str, Any]] = {} if depth else {
        key: {"name": key, "params": [], "lr": lr, "weight_decay": wd}
        for key, wd in (("decay", config.weight_decay), ("no_decay", 0.0))}
    for name, param in model.named_parameters():
        block = depth.get(id(param), top)  # the head is one step above the top layer
        where = "head" if block == top else "embeddings" if block == 0 else f"layer.{block - 1}"
        plain = no_decay(name, param)
        key = f"{where}/{'no_decay' if plain else 'decay'}" if depth else \
            ("no_decay" if plain else "decay")
        group = groups.setdefault(key, {"name": key, "params": [],
                                        "lr": lr * decay_factor ** (top - block),
                                        "weight_decay": 0.0 if plain else config.weight_decay})
        group["params"].append(param)
    return list(groups.values())


def adamw(groups: list[dict[str, Any]], config: TrainConfig) -> torch.optim.Optimizer:
    """The default optimizer: AdamW, fused where the kernel exists (5x faster on a CPU)."""
    device = next((p.device for g in groups for p in g["params"]), torch.device("cpu"))
    fused = device.type in ("cpu", "cuda") or None
    return torch.optim.AdamW(groups, lr=config.lr, fused=fused)


def make_optimizer(model: torch.nn.Module, config: TrainConfig, world_size: int,
                   groups_of: ParamGroupsFn | None = None,
                   make: OptimizerFn | None = None) -> torch.optim.Optimizer:
    """The optimizer (`make`, default `adamw`) over the parameter groups of `groups_of` (default
    `param_groups`: decay / no-decay, per layer under `layer_lr_decay`); the Trainer's
    `param_groups=` and `optimizer=`. Under `scale_lr` the lr is times the world size."""
    lr = config.lr * (world_size if config.scale_lr else 1)
    return (make or adamw)((groups_of or param_groups)(model, lr, config), config)


def logged_lr(optimizer: torch.optim.Optimizer) -> float:
    """The lr the logs show: the largest group's, which is the run's lr on its schedule (with
    layer-wise decay the head's; the first group, the embeddings', is lr x decay^(layers+1))."""
    return max(group["lr"] for group in optimizer.param_groups)


def group_settings(optimizer: torch.optim.Optimizer) -> list[dict[str, float]]:
    """Each parameter group's lr and weight decay, as this run's config made them."""
    return [{key: group[key] for key in ("lr", "weight_decay") if key in group}
            for group in optimizer.param_groups]


def keep_group_settings(optimizer: torch.optim.Optimizer, settings: list[dict[str, float]]) -> list[str]:
    """Put `settings` (`group_settings` before a checkpoint's optimizer state was loaded) back:
    the loaded state brings the old run's lr and weight decay, and a resume may change them (a
    lower lr after a divergence). The lr under way keeps its place on the schedule: times the
    new base lr over the old. Returns the changes, 'lr 0.002 -> 0.0001', for the log: each
    key's in the group it is largest in (the run's lr, not layer-wise decay's lowest layer's;
    the weight decay, not the no-decay group's 0)."""
    changed: dict[str, tuple[float, str]] = {}
    for group, wanted in zip(optimizer.param_groups, settings, strict=True):
        base = group.get("initial_lr", group["lr"])  # a schedule's base; the lr is a point on it
        now = group["lr"]
        for key, new in wanted.items():
            old = base if key == "lr" else group[key]
            if old != new and new >= changed.get(key, (-math.inf, ""))[0]:
                changed[key] = (new, f"{key} {old:g} -> {new:g}")
            group[key] = new
        if "initial_lr" in group:  # on a schedule: the lr under way, at its place on the new one
            group["initial_lr"] = wanted["lr"]
            group["lr"] = now if base == wanted["lr"] else wanted["lr"] * (now / base if base else 1.0)
    return [said for _, said in changed.values()]


def state_of_trainable_only(optimizer: torch.optim.Optimizer, state: dict[str, Any]
                            ) -> dict[str, Any] | None:
    """`state` saved when the optimizer held only the parameters then trainable (nlptrain before
    0.1.0 held no frozen ones), renumbered to this optimizer's, which holds every parameter; None
    where `state` is not that (its groups hold other counts)."""
    saved, groups = state["param_groups"], optimizer.param_groups
    trainable = [[i for i, p in enumerate(group["params"]) if p.requires_grad] for group in groups]
    if len(saved) != len(groups) or any(len(old["params"]) != len(kept)
                                        for old, kept in zip(saved, trainable, strict=True)):
        return None
    place, renumbered, start = {}, [], 0  # torch numbers the parameters across the groups
    for old, group, kept in zip(saved, groups, trainable, strict=True):
        place.update({old_id: start + i for old_id, i in zip(old["params"], kept, strict=True)})
        renumbered.append({**old, "params": list(range(start, start + len(group["params"])))})
        start += len(group["params"])
    return {"state": {place[k]: v for k, v in state["state"].items()}, "param_groups": renumbered}


def skips_on_device(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> bool:
    """Whether the optimizer can skip a non-finite step on the device (fused AdamW, no fp16 scaler)."""
    return getattr(optimizer, "_step_supports_amp_scaling", False) and not scaler.is_enabled()


def step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
         skip: torch.Tensor | None = None) -> None:
    """`optimizer.step()` through the scaler, then zero the grads. `skip` (on the device, 1 for a
    non-finite step) is passed as the `found_inf` GradScaler gives fused AdamW: the step then
    leaves weights and moments as they are, with no host sync."""
    if skip is not None:
        optimizer.grad_scale, optimizer.found_inf = None, skip
    try:
        scaler.step(optimizer)
    finally:
        if skip is not None:
            del optimizer.grad_scale, optimizer.found_inf
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
