"""The contenders of bench/run.py: what each runs, and `K@REV`, contender K as nlptrain was at a
git revision (its code and its bench script), to measure a change against the code before it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import common


@dataclass(frozen=True)
class Contender:
    key: str
    label: str
    script: str
    args: tuple[str, ...] = ()
    rev: str = ""  # "": this checkout; else the git revision whose nlptrain and script run


CONTENDERS = {c.key: c for c in [
    Contender("a", "tutorial DDP loop, pad to 128", "tutorial_ddp.py"),
    Contender("b", "transformers.Trainer, dynamic + group_by_length", "hf_trainer.py"),
    Contender("b0", "transformers.Trainer, random batches", "hf_trainer.py", ("--no-group-by-length",)),
    Contender("c", "nlptrain, pad to 128 like (a)", "nlptrain_bench.py", ("--config", "fixed")),
    Contender("d", "nlptrain default batching, (a)'s job", "nlptrain_bench.py",
              ("--config", "batching")),
    Contender("e", "(d) + bf16 autocast", "nlptrain_bench.py",
              ("--config", "batching", "--precision", "bf16")),
    Contender("e0", "(e) without the CPU step levers (issue 12's (e))", "nlptrain_bench.py",
              ("--config", "batching", "--precision", "bf16",
               "--", "--no-keep-freed-memory", "--no-sync-touched-rows",
               "--no-shared-memory-all-reduce")),
    Contender("e1", "(e) summing every gradient row (no touched-rows hook)", "nlptrain_bench.py",
              ("--config", "batching", "--precision", "bf16", "--", "--no-sync-touched-rows")),
    Contender("e2", "(e) with torch's dropout (no cpu_dropout)", "nlptrain_bench.py",
              ("--config", "batching", "--precision", "bf16", "--", "--no-cpu-dropout")),
    Contender("f", "nlptrain, every default (decay, clip)", "nlptrain_bench.py", ("--config", "defaults")),
    Contender("g", "(f) + precision auto (the default now)", "nlptrain_bench.py",
              ("--config", "defaults", "--precision", "auto")),
    Contender("h", "(d) with --max-tokens: (d)'s rows per step on average", "nlptrain_bench.py",
              ("--config", "batching", "--max-tokens-like-batch")),
    Contender("i", "(d) with eager attention, not SDPA", "nlptrain_bench.py",
              ("--config", "batching", "--attention", "eager")),
    Contender("j", "(e) with attention dropout 0 (SDPA fused in training; recipe change)",
              "nlptrain_bench.py", ("--config", "batching", "--precision", "bf16",
                                    "--attention-dropout", "0")),
]}
DEFAULT_CONTENDERS = "a,b,c,d,e"


def contender(key: str) -> Contender:
    """A listed contender, or `K@REV`: contender K with nlptrain and its bench script as they were
    at git revision REV, to measure a change against the code before it in the same run."""
    base, _, rev = key.partition("@")
    c = CONTENDERS[base]
    return replace(c, key=key, label=f"{c.label}, nlptrain at {rev}", rev=rev) if rev else c


def checkout_at(rev: str) -> Path:
    """This repository at `rev` (git archive), with that nlptrain installed into its `site/`
    folder; made once, kept under bench/.cache/. A contender at `rev` runs that checkout's bench
    script with `site/` first on PYTHONPATH, so it imports that nlptrain, not this one."""
    git = ["git", "-C", str(common.REPO)]
    sha = subprocess.run([*git, "rev-parse", "--verify", f"{rev}^{{commit}}"], check=True,
                         capture_output=True, text=True).stdout.strip()
    root = common.BENCH_DIR / ".cache" / "nlptrain-at" / sha[:12]
    if not (root / "site").is_dir():
        print(f"nlptrain at {rev} ({sha[:12]}): unpacking and installing into {root}", flush=True)
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        files = subprocess.run([*git, "archive", sha], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(root)], input=files, check=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-build-isolation", "--target", str(root / "site.partial"), str(root)],
                       check=True)
        (root / "site.partial").rename(root / "site")  # whole, or made again next time
    found = subprocess.run([sys.executable, "-c", "import nlptrain; print(nlptrain.__file__)"],
                           cwd=root / "bench", capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONPATH": str(root / "site")}).stdout.strip()
    if not Path(found).is_relative_to(root / "site"):  # an install that shadows PYTHONPATH
        raise RuntimeError(f"nlptrain at {rev} imports {found}, not its own copy in {root}")
    return root
