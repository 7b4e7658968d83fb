"""Strategies: how the model is placed, synchronized, clipped, checkpointed and exported.

The loop asks its strategy, never which one it has. `SingleDevice` (one process), `DDP` (a full
replica per rank, gradients all-reduced) and `FSDP2` (parameters, gradients and optimizer state
sharded on dim 0 across ranks by `torch.distributed.fsdp.fully_shard`). `[train] strategy` picks
one; `auto` is DDP when the world has more than one rank.

FSDP2 and DeepSpeed ZeRO: `reshard_after_forward = true` frees each layer's gathered weights
after its forward and gathers them again for the backward, like ZeRO-3 (stage 3: parameters,
gradients and optimizer state sharded); `false` keeps them gathered from forward to backward,
like ZeRO-2 (gradients and optimizer state sharded, parameters whole during the step).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_model, save_model
from torch.nn.parallel import DistributedDataParallel

from nlptrain import grad_norm
from nlptrain.checkpoint import export_model
from nlptrain.cpu_gradient_sync import CpuGradientSync, register_cpu_gradient_sync
from nlptrain.distributed import Backend
from nlptrain.errors import CheckpointError, ConfigError
from nlptrain.integrity import whole_weights_refusal
from nlptrain.optim import state_of_trainable_only

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"


@dataclass
class CheckpointWeights:
    """What a strategy puts in a checkpoint: the optimizer state for `state.pt` (None when it
    is written apart) and `write(staging)`, run on rank 0 into the checkpoint's staging folder."""

    optimizer_state: dict | None
    write: Callable[[Path], None]


class Strategy(Protocol):
    name: str
    eval_needs_equal_steps: bool  # every evaluation forward is a collective: equal batch counts
    shards_parameters: bool  # each rank holds a shard of every parameter, not the whole tensor

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module: ...
    def rewrap(self, model: torch.nn.Module) -> torch.nn.Module: ...
    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module: ...
    def no_sync(self, model: torch.nn.Module, skip_sync: bool) -> contextlib.AbstractContextManager: ...
    def evaluating(self, model: torch.nn.Module) -> contextlib.AbstractContextManager: ...
    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> torch.Tensor: ...
    def whole(self, tensor: torch.Tensor) -> torch.Tensor: ...
    def held_like(self, whole: torch.Tensor, param: torch.Tensor) -> torch.Tensor: ...
    def checkpoint_weights(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                           folder: Path) -> CheckpointWeights: ...
    def load_checkpoint_weights(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                                folder: Path, optimizer_state: dict | None) -> None: ...
    def export(self, model: torch.nn.Module, tokenizer: Any, folder: str | Path) -> None: ...
    def load_full_weights(self, model: torch.nn.Module, path: Path) -> None: ...
    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]: ...


class SingleDevice:
    """One process: the model on its device; checkpoints hold whole weights written by rank 0."""

    name = "single"
    eval_needs_equal_steps = False
    shards_parameters = False

    def __init__(self, dist: Backend) -> None:
        self.dist = dist

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.dist.device)

    def rewrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Wrap again, after `requires_grad` changed (DDP registers the trainable set when it
        wraps); every rank at the same step."""
        return self.wrap_model(self.unwrap(model))

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module, skip_sync: bool) -> Iterator[None]:
        yield

    def evaluating(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Around an evaluation's forwards (no backward follows them)."""
        return contextlib.nullcontext()

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> torch.Tensor:
        """Clip in place; the global norm before clipping, on the device (read it when needed)."""
        return grad_norm.clip_grad_norm_(model.parameters(), max_norm)

    def whole(self, tensor: torch.Tensor) -> torch.Tensor:
        """A tensor held as a parameter is (a callback's copy of it: EMA), whole; under
        sharding a collective, made by every rank."""
        return tensor

    def held_like(self, whole: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        """A whole tensor (a checkpoint's) held as `param` is: on its device, this rank's shard
        of it under sharding."""
        return whole.to(self.dist.device)

    def checkpoint_weights(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                           folder: Path) -> CheckpointWeights:
        unwrapped = self.unwrap(model)
        return CheckpointWeights(optimizer.state_dict(),
                                 lambda staging: save_model(unwrapped, str(staging / WEIGHTS_FILE)))

    def load_checkpoint_weights(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                                folder: Path, optimizer_state: dict | None) -> None:
        from nlptrain.sharded_checkpoint import SHARDS, load_shards

        if (folder / SHARDS).is_dir():  # written by FSDP2: DCP puts the shards together
            load_shards(self.unwrap(model), optimizer, folder / SHARDS, self.dist)
            return
        try:
            missing, unexpected = load_model(self.unwrap(model), str(folder / WEIGHTS_FILE),
                                             strict=False, device=str(self.dist.device))
        except RuntimeError as err:  # "size mismatch for ...": same names, other shapes
            lines = [line.strip() for line in str(err).splitlines() if "size mismatch" in line]
            raise CheckpointError(f"{folder}: weights do not fit this model "
                                  f"({(lines or [str(err)])[0][:300]})") from None
        if missing or unexpected:
            raise CheckpointError(f"{folder}: weights do not fit this model "
                                  f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
        try:
            optimizer.load_state_dict(optimizer_state)
        except ValueError as err:  # other parameter groups (param_groups=, layer_lr_decay)
            older = state_of_trainable_only(optimizer, optimizer_state)  # frozen ones left out
            if older is None:
                raise CheckpointError(f"{folder}: its optimizer state does not fit this "
                                      f"optimizer ({err})") from None
            optimizer.load_state_dict(older)

    def export(self, model: torch.nn.Module, tokenizer: Any, folder: str | Path) -> None:
        """Every rank calls this; rank 0 writes the `save_pretrained` folder."""
        self.dist.on_main(lambda: export_model(self.unwrap(model), tokenizer, folder))

    def load_full_weights(self, model: torch.nn.Module, path: Path) -> None:
        load_model(self.unwrap(model), str(path), device=str(self.dist.device))

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Whole weights (every rank calls it; under FSDP2 a collective)."""
        # A copy: on a CPU `.cpu()` would alias the live weights, which the next step changes.
        return {k: v.detach().to("cpu", copy=True) for k, v in self.unwrap(model).state_dict().items()}


def keeps_running_stats(model: torch.nn.Module) -> bool:
    """Whether a module updates buffers in its forward (BatchNorm, InstanceNorm with running
    statistics): BERT's buffers (position and type ids) never change."""
    return any(getattr(m, "track_running_stats", False) for m in model.modules())


# torch 2.13 renamed DDP's `broadcast_buffers` (and warns on the old name).
SYNC_BUFFERS = ("forward_sync_buffers" if "forward_sync_buffers" in
                inspect.signature(DistributedDataParallel).parameters else "broadcast_buffers")


class DDP(SingleDevice):
    """A full replica per rank; DDP all-reduces the gradients in buckets during the backward."""

    name = "ddp"

    def __init__(self, dist: Backend, sync_touched_rows: bool = True,
                 shared_memory_all_reduce: bool = True) -> None:
        super().__init__(dist)
        self.sync_touched_rows = sync_touched_rows
        self.shared_memory_all_reduce = shared_memory_all_reduce
        self.gradient_sync: CpuGradientSync | None = None  # the hook, once training began (CPU)
        self._hooked: torch.nn.Module | None = None
        self._ours: torch.nn.Module | None = None  # the wrapper that got our hook, not a user's
        self._checked: torch.nn.Module | None = None  # the wrapper whose first step was checked

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        model = model.to(self.dist.device)
        ids = [self.dist.device.index] if self.dist.device.type == "cuda" else None
        # Gradients live in the all-reduce buckets: no copy of every gradient each step. Buffers
        # are broadcast once here (torch < 2.13: not even here; every rank builds the same ones
        # from the seed); again before every forward (a collective a step) only when some module
        # updates its own in training (running statistics).
        sync_buffers = {SYNC_BUFFERS: keeps_running_stats(model)}
        return DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True,
                                       **sync_buffers)

    def rewrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Wrap again (see SingleDevice.rewrap), with the comm hook a callback registered on the
        old wrapper (Freeze's unfreezing dropped it, unsaid, for ours)."""
        theirs = [] if model is self._ours else list(getattr(model, "_comm_hooks", None) or [])
        wrapped = super().rewrap(model)
        for hook, state in theirs:
            wrapped.register_comm_hook(state, hook)
        return wrapped

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module, skip_sync: bool) -> Iterator[None]:
        if self._hooked is not model:
            # At the first micro-batch, after on_train_start: a comm hook a callback registered
            # there is the one DDP keeps (it takes one); else, on a CPU, the word embedding's
            # zero rows are not sent, and ranks on one host sum through shared memory.
            self._hooked = model
            if not getattr(model, "_comm_hooks", None):
                self.gradient_sync = register_cpu_gradient_sync(
                    model, self.sync_touched_rows, self.shared_memory_all_reduce)
                self._ours = model
        # Gradient accumulation: all-reduce gradients only on the micro-step that updates.
        with model.no_sync() if skip_sync else contextlib.nullcontext():
            yield
        if not skip_sync and self._checked is not model:
            self._checked = model
            _check_every_parameter_is_used(model)


def _check_every_parameter_is_used(model: torch.nn.Module) -> None:
    """After a wrapper's first synced backward: DDP waits for a gradient of every trainable
    parameter, and one the forward never used (a model of your own on BertModel, its pooler
    unused) failed the next step with torch's advice of a setting nlptrain does not pass."""
    unused = [name for name, param in model.module.named_parameters()
              if param.requires_grad and param.grad is None]
    if unused:
        raise ConfigError(
            f"DDP: {len(unused)} trainable parameter(s) got no gradient in the first step "
            f"({', '.join(unused[:4])}{', ...' if len(unused) > 4 else ''}), and DDP waits for "
            "every one: freeze them (param.requires_grad_(False)) or build the model without "
            "them (BertModel: add_pooling_layer=False)")


class FSDP2(SingleDevice):
    """`fully_shard` on each encoder layer, then on the root: each rank holds 1/N of every
    parameter, gradient and Adam state; a layer's weights are all-gathered for its forward and
    backward, its gradients reduce-scattered. Every forward is a collective."""

    name = "fsdp"
    eval_needs_equal_steps = True
    shards_parameters = True

    def rewrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Nothing to redo: FSDP2 copies each sharded parameter's `requires_grad` to the gathered
        one at every all-gather, and reduce-scatters only the gradients that exist, so a frozen
        parameter (set on every rank at the same step) gets no gradient and no update."""
        return model

    def __init__(self, dist: Backend, reshard_after_forward: bool = True,
                 precision: str = "fp32") -> None:
        super().__init__(dist)
        if precision == "fp16":
            raise ConfigError("[train] precision = fp16 with strategy fsdp: the loss scaler's "
                              "overflow check would differ between shards; use bf16")
        self.reshard_after_forward = reshard_after_forward
        self.precision = precision

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        model = model.to(self.dist.device)
        mesh = init_device_mesh(self.dist.device.type, (self.dist.world_size,))
        policy = MixedPrecisionPolicy()  # fp32: parameters and reductions as they are
        if self.precision == "bf16":  # compute in bf16, reduce gradients and keep masters in fp32
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in shard_units(model):
            fully_shard(block, mesh=mesh, reshard_after_forward=self.reshard_after_forward,
                        mp_policy=policy)
        # The root holds what is left (pooler, classifier head); it stays gathered after forward.
        return fully_shard(model, mesh=mesh, reshard_after_forward=self.reshard_after_forward,
                           mp_policy=policy)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model  # fully_shard works in place: the sharded model is the model

    def whole(self, tensor: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor  # here: a slow import, FSDP2's only

        return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor

    def held_like(self, whole: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor, distribute_tensor

        if isinstance(param, DTensor):
            return distribute_tensor(whole.to(param.device), param.device_mesh, param.placements)
        return whole.to(self.dist.device)

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module, skip_sync: bool) -> Iterator[None]:
        # No no_sync() in FSDP2: micro-steps keep whole local gradients, the last reduce-scatters.
        model.set_requires_gradient_sync(not skip_sync)
        yield

    @contextlib.contextmanager
    def evaluating(self, model: torch.nn.Module) -> Iterator[None]:
        # With reshard_after_forward false a layer is resharded by its backward, and evaluation
        # has none: its weights would stay gathered, plain tensors in place of the sharded
        # parameters, for every callback until the next backward (EMA's copy_ fails, Freeze
        # finds other parameters). Sharded again here.
        from torch.distributed.fsdp import FSDPModule

        try:
            yield
        finally:
            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)
        if isinstance(norm, DTensor):  # a partial norm per shard: the global one is a collective
            norm = norm.full_tensor()
        grad_norm.clip_by_norm_(model.parameters(), max_norm, norm)
        return norm

    def checkpoint_weights(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                           folder: Path) -> CheckpointWeights:
        from nlptrain.sharded_checkpoint import SHARDS, save_shards

        shards = save_shards(model, optimizer, folder, self.dist)  # every rank writes its shard
        return CheckpointWeights(None, lambda staging: shards.replace(staging / SHARDS))

    def load_checkpoint_weights(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                                folder: Path, optimizer_state: dict | None) -> None:
        from nlptrain.sharded_checkpoint import SHARDS, load_shards

        refusal = whole_weights_refusal(folder, self.dist.world_size)
        if refusal is not None:
            raise CheckpointError(refusal)
        load_shards(model, optimizer, folder / SHARDS, self.dist)

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Whole weights on rank 0's CPU (empty elsewhere). A collective: every rank calls it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                    cpu_offload=True))

    def export(self, model: torch.nn.Module, tokenizer: Any, folder: str | Path) -> None:
        full = self.full_state_dict(model)  # gathered on every rank first: rank 0 alone would hang
        self.dist.on_main(lambda: export_model(model, tokenizer, folder, state_dict=full))

    def load_full_weights(self, model: torch.nn.Module, path: Path) -> None:
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, load_file(str(path)),
                             options=StateDictOptions(full_state_dict=True))


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks to shard one by one: the classes a model names in `_no_split_modules`
    (BertLayer, BertEmbeddings), else the layers of its first ModuleList."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    units = [m for m in model.modules() if type(m).__name__ in names and m is not model]
    if units:
        return units
    layers = next((m for m in model.modules() if isinstance(m, torch.nn.ModuleList)), None)
    return list(layers) if layers is not None else []


def make_strategy(config: Any, dist: Backend) -> Strategy:
    """The strategy `[train] strategy` names, for this world: one rank needs no DDP or sharding."""
    if config.strategy == "fsdp" and dist.world_size > 1:
        return FSDP2(dist, config.reshard_after_forward, config.precision)
    if config.strategy == "fsdp":
        log.info("strategy fsdp on one process: nothing to shard, running on one device")
    if dist.world_size > 1:
        return DDP(dist, config.sync_touched_rows, config.shared_memory_all_reduce)
    return SingleDevice(dist)
