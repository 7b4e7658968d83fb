"""Real launches of the toy task: `--nproc 2` (torch's elastic agent), `srun -n 2` and `mpirun -n 2`
with no torchrun (each forms one 2-rank job that trains and evaluates like `--nproc 2`, weights
equal), and the launchers people arrive with (torch.distributed.launch, accelerate launch)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, TWO_RANK_TRAIN, child_env
from ddp import report_place

from nlptrain.launch import launch

TRAIN = ["-m", "nlptrain", *TWO_RANK_TRAIN]
SCAFFOLD = str(REPO / "tests" / "scaffold_callbacks.py")
# The console script of the environment running the tests, else one on PATH.
ACCELERATE = next((str(path) for path in [Path(sys.executable).with_name("accelerate")]
                   if path.exists()), None) or shutil.which("accelerate")


@pytest.fixture(scope="module")
def toy(toy_folder) -> Path:
    return toy_folder


def run(command: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=child_env(), capture_output=True, text=True,
                          timeout=timeout)


def finished_run(folder: Path, log: str) -> dict:
    config = json.loads((folder / "config.json").read_text())
    results = json.loads((folder / "results.json").read_text())
    assert results["test"]["rows"] == 40  # evaluated on every row, once
    return {"config": config, "results": results, "log": log,
            "weights": _weights(folder / "model")}


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


@pytest.fixture(scope="module")
def nproc_run(two_rank_run) -> dict:
    """`python -m nlptrain train --nproc 2`: the reference 2-rank job (conftest)."""
    return finished_run(two_rank_run.folder, two_rank_run.log)


def assert_same_job(run: dict, reference: dict, launcher: str) -> None:
    assert run["config"]["world_size"] == 2
    assert run["config"]["launch"]["launcher"] == launcher
    assert f"launched by {launcher}, 2 ranks on 1 node" in run["log"]
    assert run["results"]["test"] == reference["results"]["test"]
    assert all(torch.equal(run["weights"][k], reference["weights"][k]) for k in reference["weights"])


def test_nproc_starts_one_job_of_n_ranks(nproc_run):
    assert nproc_run["config"]["world_size"] == 2
    assert nproc_run["config"]["launch"]["launcher"] == "nlptrain --nproc"
    assert "launched by nlptrain --nproc, 2 ranks on 1 node" in nproc_run["log"]
    assert nproc_run["log"].count("launched by") == 1  # rank 0 alone says it


def test_a_resume_without_nproc_goes_on_in_the_processes_the_run_last_ran_in(toy, two_rank_run,
                                                                           tmp_path):
    """`train --output-dir RUN --resume` alone, of a `--nproc 2` run: 2 processes again, said;
    `--nproc 1` given is honoured."""
    run_dir = tmp_path / "run"
    shutil.copytree(two_rank_run.folder, run_dir)
    resumed = run([sys.executable, "-m", "nlptrain", "train", "--output-dir", str(run_dir),
                   "--resume", "--epochs", "2"], toy)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resume: 2 processes, as the run last ran (--nproc 2)" in resumed.stderr
    config = json.loads((run_dir / "config.json").read_text())
    assert config["resumes"][-1]["world_size"] == 2
    assert config["resumes"][-1]["launcher"] == "nlptrain --nproc"
    one = run([sys.executable, "-m", "nlptrain", "train", "--output-dir", str(run_dir),
               "--resume", "--epochs", "3", "--nproc", "1"], toy)
    assert one.returncode == 0 and "resume: 2 processes" not in one.stderr, one.stderr[-3000:]
    assert json.loads((run_dir / "config.json").read_text())["resumes"][-1]["world_size"] == 1


def slurm_answers() -> bool:
    """srun is installed and a controller takes jobs (installed is not enough: no daemons)."""
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@pytest.mark.skipif(not slurm_answers(), reason="no SLURM controller answers (bash .ci/start-slurm "
                    "installs and starts a one-node SLURM)")
def test_srun_tasks_form_one_job_without_torchrun(toy, nproc_run):
    out = toy / "srun"
    process = run(["srun", "-n", "2", sys.executable, *TRAIN, "--output-dir", str(out)], toy)
    assert process.returncode == 0, process.stderr[-3000:]
    assert_same_job(finished_run(out, process.stderr), nproc_run, "SLURM")


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed "
                    "(apt-get install openmpi-bin)")
def test_mpirun_ranks_form_one_job_without_torchrun(toy, nproc_run):
    out = toy / "mpirun"
    process = run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-n", "2",
                   sys.executable, *TRAIN, "--output-dir", str(out)], toy)
    assert process.returncode == 0, process.stderr[-3000:]
    assert_same_job(finished_run(out, process.stderr), nproc_run, "Open MPI")


def evaluate(toy: Path, launcher: list[str], nproc_run: dict) -> tuple[dict, str]:
    """`nlptrain eval --json` of the --nproc run's model under a launcher; cheaper than training."""
    model = toy / "nproc" / "model"
    process = run([*launcher, "-m", "nlptrain", "eval", "--model", str(model), "--task", "toy.toml",
                   "--json"], toy)
    assert process.returncode == 0, process.stderr[-3000:]
    metrics = json.loads(process.stdout[process.stdout.index("{"):])
    assert metrics["accuracy"] == nproc_run["results"]["test"]["accuracy"]
    assert metrics["rows"] == 40
    return metrics, process.stderr


def test_torch_distributed_launch_legacy_local_rank_argument(toy, nproc_run):
    """Without --use-env, torch.distributed.launch passes --local-rank=N after the module."""
    _, log = evaluate(toy, [sys.executable, "-m", "torch.distributed.launch", "--standalone",
                            "--nproc_per_node", "2"], nproc_run)
    assert "launched by torchrun, 2 ranks on 1 node" in log


@pytest.mark.skipif(ACCELERATE is None, reason="accelerate not installed (pip install accelerate)")
def test_accelerate_cpu_launch_is_one_process_and_says_so(toy, nproc_run):
    _, log = evaluate(toy, [ACCELERATE, "launch", "--cpu", "--num_processes", "2",
                            "--num_machines", "1", "--mixed_precision", "no",
                            "--dynamo_backend", "no"], nproc_run)
    assert "launched by accelerate launch, 1 process" in log


def test_launch_restarts_all_workers_after_a_failure():
    """torch's agent sees rank 1 fail, stops rank 0, and starts both again as attempt 1; the
    caller's signal handlers are its own again afterwards (the agent installs its own)."""
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    assert launch(report_place, 2, True, max_restarts=1) == [(0, 2, 1), (1, 2, 1)]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_signal_the_launcher_ignores_is_left_to_it_not_handled_by_the_agent():
    """nohup: torch's agent handled SIGHUP all the same, and passed it on to the workers, who
    stopped the run. The agent is told the signals to handle: those not ignored."""
    from nlptrain.launch import _config

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        told = _config(2, 0, "spawn").signals_to_handle
    finally:
        signal.signal(signal.SIGHUP, before)
    assert told == "SIGTERM,SIGINT,SIGQUIT"
    assert _config(2, 0, "spawn").signals_to_handle == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # (torch's)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_nproc_launcher_is_one_line_and_its_exit_code(monkeypatch, capsys, signum):
    """torch's agent stops the workers, then raises SignalException: one line, 128 + signal."""
    import torch.distributed.launcher.api as agent_api
    from torch.distributed.elastic.multiprocessing import SignalException

    from nlptrain.launch import launch_command

    def stopped(*_: object) -> None:
        raise SignalException(f"Process 1 got signal: {signum}", sigval=signum)

    monkeypatch.setattr(agent_api, "elastic_launch", lambda config, entrypoint: stopped)
    assert launch_command(["train"], 2) == 128 + signum
    assert capsys.readouterr().err == f"stopped by {signum.name}: the 2 workers were stopped\n"


@pytest.mark.parametrize("command, output_dir, said", [
    ("train", "run", "; go on with train --resume --output-dir {run}"),
    ("train", "unstarted", "; the run wrote nothing: run the same command again"),
    ("train", "old", "; the run wrote nothing: run the same command again"),  # an --overwrite's
    ("train", None, "; go on with train --resume --output-dir RUN_DIR (the run directory logged "
                    "above; none logged: run the same command again)"),
    ("predict", None, ""),
])
def test_a_signal_to_the_nproc_launcher_says_how_a_train_goes_on(monkeypatch, capsys, tmp_path,
                                                                 command, output_dir, said):
    """Outside the steps (an export, the report) the workers, stopped by the agent's SIGTERM, say
    nothing, and the launcher's line was all: no word of the resume. A new run stopped before it
    wrote anything is removed: nothing to resume."""
    import argparse

    import torch.distributed.launcher.api as agent_api
    from torch.distributed.elastic.multiprocessing import SignalException

    from nlptrain.launch import start_workers

    def stopped(*_: object) -> None:  # "run"'s workers wrote its record; "old" is as it was
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "config.json").write_text("{}")
        raise SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)

    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text("{}")
    monkeypatch.setattr(agent_api, "elastic_launch", lambda config, entrypoint: stopped)
    folder = str(tmp_path / output_dir) if output_dir else None
    args = argparse.Namespace(command=command, nproc=2, max_restarts=0)
    if command == "train":  # (eval's and predict's arguments have no --output-dir)
        args.output_dir = folder
    assert start_workers(args, [command], lambda: None) == 128 + signal.SIGTERM
    told = said.format(run=tmp_path / "run")
    assert capsys.readouterr().err.endswith(f"stopped by SIGTERM: the 2 workers were stopped{told}\n")


@pytest.mark.slow  # a whole --nproc 2 launch (about 50 s on 2 busy cores) for what the mock checks
def test_ctrl_c_on_nproc_checkpoints_and_exits_130(toy, tmp_path):
    """For real: SIGINT to `--nproc 2`'s process at step 3; the workers finish the step and
    write a checkpoint, the launcher says so in one line (torch's agent, not a mock)."""
    out = tmp_path / "stopped"
    process = subprocess.run([sys.executable, *TRAIN, "--nproc", "2", "--output-dir", str(out),
                              "--callback", f"{SCAFFOLD}:SignalTheLauncher"], cwd=toy,
                             env=child_env(AT_STEP="3"), capture_output=True, text=True, timeout=240)
    assert process.returncode == 130, process.stderr[-3000:]
    assert "stopped by SIGINT: the 2 workers were stopped" in process.stderr
    assert "Traceback" not in process.stderr, process.stderr[-3000:]
    assert process.stderr.count("SIGINT: every rank stops") <= 1  # said once, not by each rank
    assert "death signal" not in process.stderr  # torch's agent's own log line
    assert list((out / "checkpoints").iterdir())
