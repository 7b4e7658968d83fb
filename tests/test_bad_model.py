"""A model that cannot serve the task: one clear error naming the folder or the limit, exit 1,
no run directory. (Bad data and task files: test_bad_input.py.)"""

from __future__ import annotations

import re

import pytest
import torch
from cli_errors import train
from transformers import RobertaConfig, RobertaForSequenceClassification

from nlptrain.cli import main
from nlptrain.errors import ConfigError
from nlptrain.models import check_max_length


@pytest.mark.parametrize("length", ["512", "99999999999999999999"])
def test_a_max_length_beyond_the_models_positions_is_refused_before_the_run(capsys, toy_task,
                                                                           tmp_path, length):
    # The tiny model has 128 positions: the first row over 128 tokens would crash mid-epoch (and
    # a length past 2**64 in the tokenizer, before any row).
    code, err = train(capsys, toy_task, tmp_path / "run", "--max-length", length)
    assert code == 1 and "Traceback" not in err
    assert f"task toy [model]: max_length {length} is more than the model's 128 positions" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("length", ["1", "2"])
def test_a_max_length_that_leaves_no_room_for_text_is_refused_before_the_run(capsys, toy_task,
                                                                            tmp_path, length):
    # 1: the tokenizer would not truncate at all (a long row fails mid-epoch); 2: [CLS] [SEP] only.
    code, err = train(capsys, toy_task, tmp_path / "run", "--max-length", length)
    assert code == 1 and "Traceback" not in err
    assert (f"task toy [model]: max_length {length} leaves no room for the text: the tokenizer "
            "adds 2 special tokens; use at least 3") in err, err
    assert not (tmp_path / "run").exists()


def test_more_layers_than_the_model_has_are_refused_not_added_at_random(capsys, toy_task, tmp_path):
    code, err = train(capsys, toy_task, tmp_path / "run", "--num-hidden-layers", "3")
    assert code == 1 and "Traceback" not in err
    assert "num_hidden_layers 3: " in err and "has 2 encoder layers; keep at most 2 (0: all)" in err
    assert not (tmp_path / "run").exists()


def test_robertas_positions_from_pad_token_id_plus_one_are_counted():
    # RoBERTa numbers positions from pad_token_id + 1: of 34 embeddings 32 take tokens, and a
    # 33-token row fails in the forward pass, so max_length 33 must be refused.
    config = RobertaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=32, max_position_embeddings=34, pad_token_id=1)
    model = RobertaForSequenceClassification(config)
    model(input_ids=torch.full((1, 32), 5))
    with pytest.raises((IndexError, RuntimeError), match="out of"):
        model(input_ids=torch.full((1, 33), 5))
    for source in (model, config):
        with pytest.raises(ConfigError, match=r"max_length 33 is more than the model's 32 positions "
                                              r"\(of max_position_embeddings 34, numbered from "
                                              r"pad_token_id \+ 1\); use at most 32"):
            check_max_length(source, 33, "task t [model]")
        check_max_length(source, 32, "task t [model]")


def test_model_path_without_a_model(capsys, toy_task, tmp_path):
    (tmp_path / "empty-model").mkdir()
    code, err = train(capsys, toy_task, tmp_path / "run", "--model", str(tmp_path / "empty-model"))
    assert code == 1 and "empty-model: no model here (no config.json)" in err
    assert not (tmp_path / "run").exists()


def test_predict_says_a_missing_model_before_the_columns_it_would_have_read(capsys, tmp_path):
    """Without the model, its recorded columns were unknown: the input's 'no text column' was
    said first, and the missing model only once that was put right (review 119)."""
    (tmp_path / "in.tsv").write_text("sentence\tx\na film\t1\n")
    assert main(["predict", "--model", str(tmp_path / "none"), "--input", str(tmp_path / "in.tsv")]) == 1
    err = capsys.readouterr().err
    assert "none: no model here (no config.json)" in err and "no text column" not in err, err


def test_a_checkpoint_given_as_the_model_to_score_names_the_runs_model(capsys, tmp_path):
    """It said 'no config.json; give ... a short name (minilm)', which predict then refuses."""
    step = tmp_path / "run" / "checkpoints" / "step-00000004"
    step.mkdir(parents=True)
    (step / "meta.json").write_text("{}")
    (step / "state.pt").write_bytes(b"")
    (tmp_path / "in.txt").write_text("fine\n")
    assert main(["predict", "--model", str(step), "--input", str(tmp_path / "in.txt")]) == 1
    run = tmp_path / "run"
    assert capsys.readouterr().err.endswith(
        f"error: {step}: a checkpoint of a run (its training state), not a model: give the run's "
        f"model, {run / 'model'} (or {run / 'best'}); to train on from it, train --resume "
        f"--output-dir {run}\n")


@pytest.mark.parametrize(("weights", "said"), [
    (None, r"no file named model\.safetensors"),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 90000000\n",
     r"its weights file is a Git LFS pointer, not the weights: run `git lfs pull`"),
    (b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":", r"\w"),  # damaged: safetensors' own words
    ("vit", r"a vit model has no text-classification head in transformers"),
])
def test_a_model_folder_transformers_cannot_load_is_one_line(capsys, toy_task, tmp_path,
                                                             tiny_model_dir, weights, said):
    """No weights, a Git LFS pointer, damaged weights, another architecture: tracebacks."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    if weights == "vit":
        from transformers import ViTConfig

        ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=37).save_pretrained(folder)
    elif weights is not None:
        (folder / "model.safetensors").write_bytes(weights)
    code, err = train(capsys, toy_task, tmp_path / "run", "--model", str(folder))
    assert code == 1 and "Traceback" not in err and err.count("error:") == 1, err
    assert re.search(rf"error: {re.escape(str(folder))}: cannot load a text classifier from it \("
                     rf".*{said}.*\); a model folder holds what save_pretrained writes", err), err
    assert not (tmp_path / "run").exists()
