"""Test scaffolding loaded with `--callback tests/scaffold_callbacks.py:NAME`: faults injected at a
given optimizer step (env AT_STEP), so crash and resume paths run for real, and probes of the
process a run trains in."""

from __future__ import annotations

import gc
import json
import math
import os
import signal
import time

import torch

from nlptrain import Callback


def at_step() -> int:
    return int(os.environ.get("AT_STEP", "5"))


def first_attempt() -> bool:
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


class KillRank1(Callback):
    """SIGKILL on rank 1 at AT_STEP, on the first attempt only (torchrun restarts the job)."""

    def on_step_end(self, trainer) -> None:
        if first_attempt() and trainer.dist.rank == 1 and trainer.global_step == at_step():
            os.kill(os.getpid(), signal.SIGKILL)


class RaiseAtStep(Callback):
    """A crash on every rank at AT_STEP (unless resuming past it)."""

    def on_step_end(self, trainer) -> None:
        if trainer.global_step == at_step() and not os.environ.get("NO_FAULT"):
            raise RuntimeError(f"injected crash at step {at_step()}")


class ExitRank1(Callback):
    """`sys.exit(3)` on rank 1 at AT_STEP: a worker that ends with no traceback of its own."""

    def on_step_end(self, trainer) -> None:
        if trainer.dist.rank == 1 and trainer.global_step == at_step():
            raise SystemExit(3)


class CtrlCRank1(Callback):
    """A KeyboardInterrupt on rank 1 at AT_STEP: what a second Ctrl-C raises, on one rank."""

    def on_step_end(self, trainer) -> None:
        if trainer.dist.rank == 1 and trainer.global_step == at_step():
            raise KeyboardInterrupt


class SigtermRank0(Callback):
    """SIGTERM to rank 0 alone at AT_STEP, as a scheduler or a user would send it."""

    def on_step_end(self, trainer) -> None:
        if trainer.global_step == at_step() and trainer.dist.rank == 0 and not os.environ.get("NO_FAULT"):
            os.kill(os.getpid(), signal.SIGTERM)


class SignalTheLauncher(Callback):
    """Signal SIGNAL (default SIGINT) to rank 0's parent, the launcher, at AT_STEP: a Ctrl-C or a
    scheduler's SIGTERM to `--nproc`'s own process."""

    def on_step_end(self, trainer) -> None:
        if trainer.global_step == at_step() and trainer.dist.rank == 0:
            os.kill(os.getppid(), getattr(signal, os.environ.get("SIGNAL", "SIGINT")))


class PoisonWeights(Callback):
    """Weights become NaN before the batch after AT_STEP, so that batch's loss is NaN."""

    def on_batch_start(self, trainer, batch) -> None:
        if trainer.global_step == at_step():
            with torch.no_grad():
                for param in trainer.unwrapped_model.parameters():
                    param.fill_(math.nan)


class DivergesAboveLr(Callback):
    """From AT_STEP on, the loss is infinite while the lr is above LR_LIMIT (default 1e-3): a
    divergence that a lower lr cures."""

    def on_train_start(self, trainer) -> None:
        plain, limit = trainer.loss_fn, float(os.environ.get("LR_LIMIT", "1e-3"))

        def loss_fn(logits, targets):
            loss = plain(logits, targets)
            high = trainer.optimizer.param_groups[0]["lr"] > limit
            return loss * math.inf if trainer.global_step >= at_step() and high else loss

        trainer.loss_fn = loss_fn


class DieWhileWritingCheckpoint(Callback):
    """SIGKILL halfway through writing the second checkpoint's state file."""

    def __init__(self) -> None:
        real_save = torch.save
        calls = {"n": 0}

        def dying_save(obj, path, *args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 2:
                real_save(obj, path, *args, **kwargs)
                with open(path, "r+b") as handle:
                    handle.truncate(os.path.getsize(path) // 2)
                os.kill(os.getpid(), signal.SIGKILL)
            return real_save(obj, path, *args, **kwargs)

        torch.save = dying_save


class RecordRows(Callback):
    """Appends `rank epoch step row` for every trained row to $ROWS_FILE (all ranks, one file)."""

    def on_batch_start(self, trainer, batch) -> None:
        lines = "".join(f"{trainer.dist.rank} {trainer.epoch} {trainer.global_step + 1} {int(i)}\n"
                        for i in batch["index"])
        with open(os.environ["ROWS_FILE"], "a") as handle:
            handle.write(lines)


class DamageLatestCheckpointThenDie(Callback):
    """On the first attempt, at AT_STEP: rank 0 cuts the latest checkpoint's weights file to half
    (a copy cut short, a full disk), then SIGKILLs itself; torchrun restarts the job."""

    def on_step_end(self, trainer) -> None:
        if first_attempt() and trainer.dist.rank == 0 and trainer.global_step == at_step():
            from nlptrain.callbacks import Checkpointer

            from nlptrain.checkpoint import list_checkpoints

            folder = trainer.callbacks.find(Checkpointer)[0].folder
            weights = list_checkpoints(folder)[-1] / "model.safetensors"
            with open(weights, "r+b") as handle:
                handle.truncate(weights.stat().st_size // 2)
            os.kill(os.getpid(), signal.SIGKILL)


class SpoilEvaluationsAfter(Callback):
    """Every evaluation after step BEST_STEP sees a confidently wrong classifier (weights back
    after it), so the best model is the one of BEST_STEP whatever the training does."""

    def on_valid_start(self, trainer) -> None:
        self.kept = None
        if trainer.global_step > int(os.environ["BEST_STEP"]):
            head = trainer.unwrapped_model.classifier
            self.kept = head.weight.detach().clone(), head.bias.detach().clone()
            with torch.no_grad():
                head.weight.zero_()
                head.bias.copy_(torch.tensor([50.0, -50.0]))  # "neg" for every row

    def on_valid_end(self, trainer, metrics, is_best) -> None:
        if self.kept is not None:
            head = trainer.unwrapped_model.classifier
            with torch.no_grad():
                head.weight.copy_(self.kept[0])
                head.bias.copy_(self.kept[1])


class SigtermDuringEvaluation(Callback):
    """SIGTERM to this process while the evaluation after step AT_STEP runs (the epoch's end)."""

    def on_valid_start(self, trainer) -> None:
        if trainer.global_step == at_step() and not os.environ.get("NO_FAULT"):
            os.kill(os.getpid(), signal.SIGTERM)


class SecondCtrlCAtStep(Callback):
    """What a second Ctrl-C does at AT_STEP: the default SIGINT handler's KeyboardInterrupt."""

    def on_step_end(self, trainer) -> None:
        if trainer.global_step == at_step() and not os.environ.get("NO_FAULT"):
            raise KeyboardInterrupt


class StallRank1(Callback):
    """Rank 1 sleeps STALL_S seconds (default 60) at AT_STEP: a stuck rank, which the others give
    up waiting for after [train] timeout."""

    def on_step_end(self, trainer) -> None:
        if trainer.dist.rank == 1 and trainer.global_step == at_step():
            time.sleep(float(os.environ.get("STALL_S", "60")))


class CollectorState(Callback):
    """Writes the cyclic collector's state at on_train_start to the file COLLECTOR_STATE (JSON)."""

    def on_train_start(self, trainer) -> None:
        with open(os.environ["COLLECTOR_STATE"], "w") as out:
            json.dump({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}, out)


class SigtermAfterTraining(Callback):
    """SIGTERM to this process at the first forward once the steps are over: as the test set is
    scored (no event fires there)."""

    def on_train_end(self, trainer) -> None:
        if not os.environ.get("NO_FAULT"):
            trainer.unwrapped_model.register_forward_pre_hook(
                lambda module, inputs: os.kill(os.getpid(), signal.SIGTERM))


class KillDataLoaderWorker(Callback):
    """SIGKILL to a DataLoader worker of this process at AT_STEP, as the out-of-memory killer
    ends one; torch's SIGCHLD handler then raises in the main process wherever it is."""

    def on_step_end(self, trainer) -> None:
        if trainer.global_step == at_step():
            import multiprocessing

            os.kill(multiprocessing.active_children()[0].pid, signal.SIGKILL)
            time.sleep(5)  # the SIGCHLD arrives here, or in what follows


class SigtermProcessGroup(Callback):
    """SIGTERM to this process's whole group at AT_STEP (DataLoader workers included), as a
    scheduler's preemption or a Ctrl-C in a terminal sends it."""

    def on_step_end(self, trainer) -> None:
        if trainer.global_step == at_step() and not os.environ.get("NO_FAULT"):
            os.killpg(os.getpgid(0), signal.SIGTERM)


class StuckDataLoaderWorker(Callback):
    """Training data that no DataLoader worker ever gives a row of (its reads wait for good, as a
    deadlocked reader's would): the loader's timeout must end the run."""

    def on_train_start(self, trainer) -> None:
        trainer.train_data = _StuckInWorkers(trainer.train_data)


class StuckStreamWorker(Callback):
    """The same as a stream (an IterableDataset read for [train] steps_per_epoch), which nlptrain
    reads pass after pass."""

    def on_train_start(self, trainer) -> None:
        trainer.train_data = _StuckStreamInWorkers(trainer.train_data)


class _StuckStreamInWorkers(torch.utils.data.IterableDataset):
    def __init__(self, data) -> None:
        self.data = data

    def __iter__(self):
        if torch.utils.data.get_worker_info() is not None:
            time.sleep(3600)
        return (self.data[i] for i in range(len(self.data)))


class _StuckInWorkers(torch.utils.data.Dataset):
    def __init__(self, data) -> None:
        self.data, self.lengths = data, data.lengths

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        if torch.utils.data.get_worker_info() is not None:
            time.sleep(3600)
        return self.data[i]
