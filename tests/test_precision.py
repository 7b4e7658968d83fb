"""`precision = "auto"`: a measured choice (bf16 only where this CPU runs it clearly faster),
logged, written to config.json and to checkpoints, kept on resume; explicit values as asked."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
import torch
from cpu_speed import pretend_cpu_speedups
from ddp import run_ranks

from nlptrain import TrainConfig, Trainer
from nlptrain.cli import main
from nlptrain.errors import ConfigError
from nlptrain.loaders import typical_batch
from nlptrain.precision import (
    CLEARLY_FASTER,
    PIN_VARIABLE,
    JobStep,
    choose,
    choose_by_step,
    probe_cpu_matmuls,
    probe_job_step,
)


def test_explicit_precisions_are_kept_as_asked():
    for asked in ("fp32", "bf16", "fp16"):
        chosen = choose(asked, torch.device("cpu"))
        assert (chosen.precision, chosen.reason) == (asked, "asked for")
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        choose("fp8", torch.device("cpu"))


def test_auto_on_the_cpu_follows_a_short_probe(monkeypatch):
    monkeypatch.delenv(PIN_VARIABLE)
    probe = probe_cpu_matmuls()
    assert probe["probe_ms"] < 1000 and probe["fp32_ms"] > 0 and probe["bf16_ms"] > 0
    chosen = choose("auto", torch.device("cpu"))
    speedup = chosen.probe["bf16_speedup"]
    assert chosen.precision == ("bf16" if speedup >= CLEARLY_FASTER else "fp32")
    assert f"bf16 matmuls {speedup:.2f}x fp32 on this CPU" in chosen.reason
    assert chosen.record()["probe"]["threads"] == 1  # the units' speed, not the threads' waits


def test_the_probe_leaves_the_thread_count_as_it_was():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        probe_cpu_matmuls()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_pin_replaces_the_probe(monkeypatch):
    monkeypatch.setenv(PIN_VARIABLE, "bf16")
    assert choose("auto", torch.device("cpu")).record() == {
        "requested": "auto", "chosen": "bf16", "reason": f"pinned by {PIN_VARIABLE}", "probe": {}}
    monkeypatch.setenv(PIN_VARIABLE, "fp16")
    with pytest.raises(ConfigError, match="use fp32 or bf16"):  # one line, not a traceback
        choose("auto", torch.device("cpu"))


def _choose_with_a_pin_of_its_own(rank: int, world: int) -> str:
    from nlptrain import distributed

    os.environ[PIN_VARIABLE] = "bf16" if rank == 1 else "fp32"
    dist = distributed.from_env()
    try:
        return choose("auto", torch.device("cpu"), dist).precision
    finally:
        dist.close()


def _choose_with_a_bad_pin_on(rank: int, world: int, bad_rank: int) -> str:
    from nlptrain import distributed

    os.environ[PIN_VARIABLE] = "fp16" if rank == bad_rank else "fp32"
    dist = distributed.from_env()
    try:
        return choose("auto", torch.device("cpu"), dist).precision
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    finally:
        dist.close()


@pytest.mark.distributed
def test_every_rank_takes_rank_0s_choice_even_a_pinned_one(tmp_path):
    assert run_ranks(_choose_with_a_pin_of_its_own, 2, tmp_path) == ["fp32", "fp32"]
    # Rank 0 alone decides: another rank's pin is never read (it stopped that rank alone, and
    # rank 0 waited), and a bad pin on rank 0 is its error, the others told that rank 0 failed.
    assert run_ranks(_choose_with_a_bad_pin_on, 2, tmp_path, 1) == [
        "fp32", "fp32"]
    said = run_ranks(_choose_with_a_bad_pin_on, 2, tmp_path, 0)
    assert said[0] == "ConfigError: NLPTRAIN_AUTO_PRECISION='fp16': use fp32 or bf16, or unset it"
    assert said[1].startswith("RemoteRankError: rank 0 failed: ConfigError"), said


def test_the_trainer_trains_in_the_chosen_precision_and_says_so(tiny_model_dir, caplog, monkeypatch):
    from transformers import AutoModelForSequenceClassification

    monkeypatch.delenv(PIN_VARIABLE)
    model = AutoModelForSequenceClassification.from_pretrained(str(tiny_model_dir), num_labels=2)
    config = TrainConfig()
    with caplog.at_level("INFO", logger="nlptrain"):
        trainer = Trainer(model, config=config)
    assert config.precision == "auto"  # the user's config is left as given
    assert trainer.config.precision == trainer.precision.precision in ("fp32", "bf16")
    assert f"precision auto: {trainer.config.precision} (bf16 matmuls" in caplog.text


def test_config_json_and_checkpoints_record_it_and_a_resume_keeps_it(toy_task, tmp_path,
                                                                    monkeypatch, capsys):
    run = tmp_path / "run"
    args = ["train", "--task", str(toy_task), "--output-dir", str(run), "--steps-per-epoch", "2"]
    monkeypatch.setenv(PIN_VARIABLE, "bf16")
    assert main([*args, "--epochs", "1"]) == 0
    assert "precision auto: bf16 (pinned by" in capsys.readouterr().err
    record = json.loads((run / "config.json").read_text())
    assert record["precision"]["chosen"] == "bf16" and record["task"]["train"]["precision"] == "auto"
    step = sorted((run / "checkpoints").iterdir())[-1]
    assert json.loads((step / "meta.json").read_text())["precision"] == "bf16"
    # The report and the model card say what the run trained in, not only that auto was asked.
    assert "| precision | bf16 (auto) |" in (run / "report.md").read_text()
    assert "| precision | bf16 (auto) |" in (run / "model" / "README.md").read_text()
    # Resumed where auto would now pick fp32: the run goes on in the precision it started in.
    monkeypatch.setenv(PIN_VARIABLE, "fp32")
    assert main([*args, "--epochs", "2", "--resume"]) == 0
    err = capsys.readouterr().err
    assert "resumed from" in err and "precision auto: bf16 (kept from step-" in err
    assert json.loads((run / "config.json").read_text())["precision"]["chosen"] == "bf16"
    assert json.loads((sorted((run / "checkpoints").iterdir())[-1] / "meta.json").read_text()
                      )["precision"] == "bf16"
    # `eval` under auto scores in the precision the model was trained and tested in (its
    # config.json says which), whatever auto would pick now; a model without that record is
    # decided as auto decides, and either way it says what it chose.
    pretend_cpu_speedups(monkeypatch, bf16=2.0)  # (a CPU without bf16 units: see below)
    assert main(["eval", "--model", str(run / "model"), "--task", str(toy_task)]) == 0
    assert "precision auto: bf16 (the model was trained and tested in it)" in capsys.readouterr().err
    model_config = run / "model" / "config.json"
    recorded = json.loads(model_config.read_text())
    assert recorded.pop("nlptrain_precision") == "bf16"
    model_config.write_text(json.dumps(recorded))
    assert main(["eval", "--model", str(run / "model"), "--task", str(toy_task)]) == 0
    assert "precision auto: fp32 (pinned by" in capsys.readouterr().err


def test_a_resume_in_another_explicit_precision_goes_on_as_asked(tiny_model_dir, tmp_path, caplog):
    from toy_trainer import make_trainer

    from nlptrain.checkpoint import load_checkpoint, save_checkpoint

    first = make_trainer(tmp_path, tiny_model_dir, [], epochs=1, precision="bf16")
    first.fit()
    save_checkpoint(first, tmp_path / "bf16")
    # bf16 (no loss scaler) -> fp16: the scaler starts afresh, training goes on in fp16.
    resumed = make_trainer(tmp_path, tiny_model_dir, [], epochs=2, precision="fp16")
    with caplog.at_level("INFO", logger="nlptrain"):
        load_checkpoint(resumed, tmp_path / "bf16")
    assert "was trained in bf16; it goes on in fp16, as asked" in caplog.text
    assert "fp16's loss scaler starts at its initial scale" in caplog.text
    resumed.fit()
    assert resumed.global_step == 2 * first.global_step and resumed.scaler.is_enabled()
    # fp16 -> fp16: the scaler's state (its scale, its growth count) comes back as it was saved.
    save_checkpoint(resumed, tmp_path / "fp16")
    again = make_trainer(tmp_path, tiny_model_dir, [], epochs=3, precision="fp16")
    load_checkpoint(again, tmp_path / "fp16")
    assert again.scaler.state_dict() == resumed.scaler.state_dict()


@pytest.mark.filterwarnings("ignore:.*CUDA is not available:UserWarning")
def test_a_half_precision_forward_on_a_gpu_leaves_cudnn_attention_out_and_restores_it():
    """cuDNN's attention builds a plan per new batch shape (dynamic padding meets dozens): every
    bf16/fp16 forward on a GPU runs without it; fp32 and CPU forwards change nothing."""
    from nlptrain.precision import autocast

    flags = (torch.backends.cuda.cudnn_sdp_enabled, torch.backends.cuda.flash_sdp_enabled,
             torch.backends.cuda.mem_efficient_sdp_enabled)
    before = [flag() for flag in flags]
    assert before[0], "torch's default: cuDNN attention allowed"
    for precision in ("bf16", "fp16"):
        with autocast(torch.device("cuda"), precision):
            assert [flag() for flag in flags] == [False, True, True]
        assert [flag() for flag in flags] == before
    for device, precision in (("cuda", "fp32"), ("cpu", "bf16")):
        with autocast(torch.device(device), precision):
            assert [flag() for flag in flags] == before


class TimedStep(JobStep):
    """A job step that takes a set time in each precision (the GPU's choice, decided on a CPU)."""

    def __init__(self, seconds: dict[str, float]) -> None:
        super().__init__(torch.nn.Identity(), {"input_ids": torch.zeros(16, 40, dtype=torch.long)},
                         lambda batch: batch["input_ids"])
        self.seconds, self.runs = seconds, []

    def run(self, device: torch.device, precision: str) -> None:
        self.runs.append(precision)
        time.sleep(self.seconds[precision])


def test_on_a_gpu_auto_times_the_jobs_own_step_and_keeps_fp32_where_bf16_is_slower():
    """A small model at a small batch is launch-bound on a GPU, and autocast's casts make bf16
    the slower (MiniLM, batch 16, H200: 0.71x): the job's own step decides, not the matmuls."""
    slower = TimedStep({"fp32": 0.004, "bf16": 0.006})
    chosen = choose_by_step(slower, torch.device("cpu"), "a GPU")
    assert chosen.precision == "fp32" and chosen.probe["bf16_speedup"] < 1
    assert chosen.reason.startswith("the job's step (batch 16x40) 0.")
    assert "as fast in bf16 as in fp32 on a GPU" in chosen.reason
    # untimed warm-up of each, then timed rounds interleaved, within the budget
    assert slower.runs[:4] == ["fp32", "bf16", "fp32", "bf16"] and len(slower.runs) <= 12
    assert choose_by_step(TimedStep({"fp32": 0.006, "bf16": 0.002}), torch.device("cpu"),
                          "a GPU").precision == "bf16"


def test_the_timed_step_leaves_no_trace_on_the_model_or_the_rng(tiny_model_dir, tmp_path):
    from toy_trainer import toy_datasets
    from transformers import AutoModelForSequenceClassification

    from nlptrain.data import Collator
    from nlptrain.evaluate import logits_of, model_inputs

    train, _ = toy_datasets(tmp_path, tiny_model_dir, rows=24)
    model = AutoModelForSequenceClassification.from_pretrained(str(tiny_model_dir), num_labels=2)
    model.train()
    batch = typical_batch(train, Collator(0), 8)
    lengths = sorted(train.lengths)
    # the middle of the rows by length: a batch as long as most length-grouped batches
    assert batch["input_ids"].shape == (8, max(lengths[8:16]))
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    step = JobStep(model, batch, lambda b: logits_of(model(**model_inputs(b))))
    probe = probe_job_step(step, torch.device("cpu"))
    assert probe["fp32_ms"] > 0 and probe["bf16_ms"] > 0 and probe["probe_ms"] < 5000
    assert model.training and all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)  # eval mode: no dropout draw
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    # nothing to take without reading it: no step, and auto falls back on what the GPU supports
    assert typical_batch(iter(train), Collator(0), 8) is None
    assert typical_batch([], Collator(0), 8) is None


def test_the_timed_step_under_a_token_budget_is_a_budget_sized_batch(tiny_model_dir, tmp_path):
    """Under max_tokens the step timed for "auto" on a GPU holds the budget's rows, not
    batch_size's: bf16's gain depends on the batch's size."""
    from toy_trainer import toy_datasets

    from nlptrain.data import Collator

    train, _ = toy_datasets(tmp_path, tiny_model_dir, rows=200)
    typical = int(np.median(train.lengths))
    batch = typical_batch(train, Collator(0), 8, max_tokens=64 * typical)
    assert batch["input_ids"].shape[0] == 64
    assert typical_batch(train, Collator(0), 8, max_tokens=1)["input_ids"].shape[0] == 1
    # padded wider (pad_to): as many rows of that width as the budget holds (review 123)
    padded = typical_batch(train, Collator(0, pad_to=64), 8, max_tokens=256)["input_ids"]
    assert padded.shape == (4, 64)


def test_the_cpu_probe_tries_again_while_bf16_looks_slow_and_keeps_its_best(monkeypatch):
    """Load can hide bf16's speed (a probe measures tenths of a millisecond) but not fake it: a
    probe short of CLEARLY_FASTER is repeated, up to 3 in all, the fastest bf16 kept."""
    import nlptrain.precision as precision

    def probes(speedups):
        found = iter(speedups)
        monkeypatch.setattr(precision, "probe_cpu_matmuls",
                            lambda: {"bf16_speedup": next(found), "fp32_ms": 1.0, "bf16_ms": 1.0})

    probes([0.5, 3.1, 0.4])  # slowed by a neighbour, then clearly faster: no third probe
    assert precision.probe_cpu() == {"bf16_speedup": 3.1, "fp32_ms": 1.0, "bf16_ms": 1.0,
                                     "attempts": 2}
    probes([0.03, 0.04, 0.02, 5.0])  # no bf16 units: three probes, then fp32
    found = precision.probe_cpu()
    assert (found["bf16_speedup"], found["attempts"]) == (0.04, 3)
    probes([4.0])
    assert precision.probe_cpu()["attempts"] == 1


def test_fp16_asked_for_on_a_cpu_without_fp16_units_says_what_is_faster(monkeypatch, caplog):
    """fp16 is kept as asked, but where its matmuls are not clearly faster than fp32's (most
    CPUs) the log says so and names the faster precision, measured the same way as "auto"."""
    import nlptrain.precision as precision

    probe = probe_cpu_matmuls(precisions=("fp32", "bf16", "fp16"))
    assert probe["fp16_speedup"] == pytest.approx(probe["fp32_ms"] / probe["fp16_ms"])

    def measured(fp16: float, bf16: float) -> None:
        monkeypatch.setattr(precision, "probe_cpu_matmuls", lambda precisions: {
            "fp16_speedup": fp16, "bf16_speedup": bf16})

    for fp16, bf16, said in ((0.9, 5.2, "bf16 (--precision bf16, or auto) runs faster"),
                             (0.1, 0.03, "fp32 runs faster"), (3.0, 3.0, None)):
        measured(fp16, bf16)
        caplog.clear()
        with caplog.at_level("WARNING", logger="nlptrain"):
            assert choose("fp16", torch.device("cpu")).precision == "fp16"
        if said is None:  # a CPU with fp16 units: nothing to say
            assert not caplog.records
        else:
            assert f"fp16 matmuls run {fp16:.2f}x as fast as fp32's here" in caplog.text
            assert said in caplog.text, caplog.text


@pytest.mark.parametrize(("trained_in", "speedup", "chosen"), [
    ("bf16", 2.0, "bf16"), ("bf16", 0.7, "bf16"), ("bf16", 0.03, "fp32"), ("fp16", 0.02, "fp32"),
    ("fp32", 0.01, "fp32")])
def test_scoring_keeps_the_models_precision_unless_this_cpu_runs_it_far_slower(
        monkeypatch, caplog, trained_in, speedup, chosen):
    """A model trained in fp16 on a GPU was scored in fp16 on a CPU without fp16 units (0.02x:
    predict took twice fp32's time, unsaid). Its run's precision is kept where this CPU runs it
    at least half as fast as fp32 (its scores then equal its run's), else fp32, said."""
    from nlptrain.precision import for_scoring

    pretend_cpu_speedups(monkeypatch, **{trained_in: speedup})
    with caplog.at_level("INFO", logger="nlptrain"):
        assert for_scoring("auto", trained_in, torch.device("cpu")) == chosen
    if chosen == trained_in:
        assert f"precision auto: {chosen} (the model was trained and tested in it)" in caplog.text
    else:
        assert (f"precision auto: fp32 (the model was trained in {trained_in}, whose matmuls run "
                f"{speedup:.2f}x as fast as fp32's on this CPU; --precision {trained_in} scores "
                "exactly as its run did)") in caplog.text
    assert for_scoring(trained_in, trained_in, torch.device("cpu")) == trained_in  # as asked


def test_under_bf16_the_logits_are_not_rounded_to_bf16(tiny_model_dir, tmp_path):
    """bf16 autocast rounded the classifier's logits to 8 bits: a regression's scores came in
    steps of 1/64 near 3, tied (Spearman counted the ties), and classes' probabilities tied, argmax
    taking the lower id. The last layer now runs in fp32, in training, in the trainer's
    evaluation and in a loaded export's scoring; a trained step still moves its weights."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from nlptrain.data import TokenizedDataset
    from nlptrain.data.tokenized import Collator
    from nlptrain.distributed import SingleProcess
    from nlptrain.evaluate import predict
    from nlptrain.kinds import from_model_config

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    texts = [f"review number {i} of {'a fine' if i % 2 else 'a dull'} film" for i in range(48)]
    scores = [float(i % 5) for i in range(48)]
    data = TokenizedDataset.from_texts(texts, scores, tokenizer, 32)

    def not_bf16(outputs):  # the share of outputs that bf16 cannot hold exactly
        values = torch.as_tensor(outputs).float()
        return (values != values.bfloat16().float()).float().mean().item()

    model = AutoModelForSequenceClassification.from_pretrained(str(tiny_model_dir), num_labels=1,
                                                               ignore_mismatched_sizes=True)
    trainer = Trainer(model, data, data, config=TrainConfig(precision="bf16", epochs=1, batch_size=16,
                                                            lr=1e-3), kind="regression", progress=False)
    head = trainer.unwrapped_model.classifier.weight.detach().clone()
    trainer.fit()
    assert not torch.equal(head, trainer.unwrapped_model.classifier.weight)
    assert trainer.predictions is not None and not_bf16(trainer.predictions.outputs) > 0.9
    trainer.unwrapped_model.save_pretrained(tmp_path / "export")

    loaded = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "export"))
    found = predict(loaded, data, SingleProcess(), Collator(tokenizer.pad_token_id, multiple=8), 16, "bf16",
                    from_model_config(loaded.config))
    assert not_bf16(found.outputs) > 0.9
    assert found.outputs == pytest.approx(trainer.predictions.outputs, abs=1e-6)


def test_only_a_plain_linear_is_made_to_give_fp32_logits_and_the_model_still_pickles():
    """A Linear of the user's own class keeps its forward (a cosine head's would be replaced by
    a plain one, in fp32 too); a whole model saved with torch.save loads back."""
    import io

    from nlptrain.precision import LogitsLinear, logits_in_fp32

    class ScaledHead(torch.nn.Linear):
        def forward(self, features):
            return super().forward(features) * 2

    own = torch.nn.Sequential(torch.nn.Linear(4, 4), ScaledHead(4, 2))
    logits_in_fp32(own, 2)
    assert type(own[1]) is ScaledHead
    plain = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Tanh(), torch.nn.Linear(2, 2))
    logits_in_fp32(plain, 2)
    assert type(plain[0]) is torch.nn.Linear and type(plain[2]) is LogitsLinear  # the last one
    saved = io.BytesIO()
    torch.save(plain, saved)
    saved.seek(0)
    assert type(torch.load(saved, weights_only=False)[2]) is LogitsLinear
