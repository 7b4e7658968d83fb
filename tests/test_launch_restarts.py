"""A launcher's restart (torchrun's, --nproc's --max-restarts, a requeued SLURM job) resumes the
run its own launch began, and no other: from exactly the variables each launcher sets."""

from __future__ import annotations

import logging

from launch_environs import SRUN, TORCHRUN

from nlptrain import cli
from nlptrain.environments import detect


def test_a_requeued_slurm_job_finds_its_own_run_directory(tmp_path):
    from nlptrain.runs import launch_run_dir, prepare_run_dir

    first = detect({**SRUN, "SLURM_JOB_ID": "77"})
    folder = tmp_path / "toy-20250101-000000"
    prepare_run_dir(folder, {"name": "toy"}, 2, resume=False, overwrite=False, launch=first)
    requeued = detect({**SRUN, "SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1"})
    assert launch_run_dir("toy", str(tmp_path), requeued) == folder
    assert launch_run_dir("toy", str(tmp_path), first) is None  # a new job: a new folder


def test_torchrun_in_a_requeued_slurm_job_resumes_its_run_and_no_other_launchs(tmp_path):
    """`srun torchrun --standalone ...` (or `srun nlptrain --nproc N`), the README's launch: a
    requeue starts torchrun anew, at attempt 0 with a new run id, so its run directory was
    refused as "already holds a run". Another launch's restart in the same allocation (the same
    job id, not requeued) must not take it for its own."""
    from nlptrain.runs import began_in_this_launch, launch_run_dir, prepare_run_dir

    job = {"SLURM_JOB_ID": "4271", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0"}
    first = detect({**TORCHRUN, **job, "TORCHELASTIC_RESTART_COUNT": "0"})
    folder = tmp_path / "toy-20250101-000000"
    prepare_run_dir(folder, {"name": "toy"}, 2, resume=False, overwrite=False, launch=first)
    requeued = detect({**TORCHRUN, **job, "TORCHELASTIC_RUN_ID": "new", "TORCHELASTIC_RESTART_COUNT": "0",
                       "SLURM_RESTART_COUNT": "1"})
    assert requeued.restart_count == 1 and requeued.job_id == "slurm-4271"
    assert began_in_this_launch(folder, requeued) and launch_run_dir("toy", str(tmp_path), requeued) == folder
    beside = detect({**TORCHRUN, **job, "TORCHELASTIC_RUN_ID": "other"})  # restart 1 of its own
    assert not began_in_this_launch(folder, beside) and launch_run_dir("toy", str(tmp_path), beside) is None



def test_torchruns_default_run_id_names_no_launch(tmp_path, caplog):
    """torchrun's static rendezvous (--master-port, or no --rdzv-id) gives every launch the run id
    'none': a restart whose first attempt wrote no run directory starts one, never taking an
    older run's for its own."""
    from nlptrain.runs import launch_run_dir, prepare_run_dir

    static = {**TORCHRUN, "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0"}
    older = tmp_path / "toy-20250101-000000"
    prepare_run_dir(older, {"name": "toy"}, 2, resume=False, overwrite=False, launch=detect(static))
    restarted = detect({**static, "TORCHELASTIC_RESTART_COUNT": "1"})
    assert restarted.run_id is None and detect({**static, "TORCHELASTIC_RUN_ID": ""}).run_id is None
    logger = logging.getLogger("nlptrain.runs")
    logger.addHandler(caplog.handler)  # "nlptrain" may not propagate (setup_logging)
    try:
        assert launch_run_dir("toy", str(tmp_path), restarted) is None  # not the older run's
    finally:
        logger.removeHandler(caplog.handler)
    assert "restart 1: no run directory of this launch (run id none)" in caplog.text


def test_a_restart_resumes_only_a_run_its_own_launch_began_or_resumed(tmp_path):
    """`--max-restarts` on a folder holding an older job's run: the first attempt refuses it
    ("already holds a run"), and the restart must refuse again, not resume and overwrite it."""
    from nlptrain.runs import began_in_this_launch, prepare_run_dir

    def launch(run_id: str, restart: int = 0):
        return detect({**TORCHRUN, "TORCHELASTIC_RUN_ID": run_id,
                       "TORCHELASTIC_RESTART_COUNT": str(restart)})

    folder, task = tmp_path / "run", {"name": "toy", "data": {}, "model": {}, "train": {}}
    prepare_run_dir(folder, task, 2, resume=False, overwrite=False, launch=launch("a"))
    assert began_in_this_launch(folder, launch("a", 1))
    assert not began_in_this_launch(folder, launch("b", 1))  # an older job's run
    prepare_run_dir(folder, task, 2, resume=True, overwrite=False, launch=launch("b"))
    assert began_in_this_launch(folder, launch("b", 1))  # resumed by "b": its restart goes on
    assert began_in_this_launch(folder, launch("none", 1))  # no id to tell by: as before
    assert began_in_this_launch(tmp_path / "empty", launch("c", 1))


def test_a_folder_holding_a_run_is_refused_before_nproc_starts_workers(toy_task, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"task": {}, "world_size": 1}')  # a run's record
    args = ["train", "--task", str(toy_task), "--output-dir", str(run), "--nproc", "2",
            "--max-restarts", "1"]
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert f"{run}: already holds a run; use --resume" in err and "launched by" not in err
    assert (run / "config.json").read_text() == '{"task": {}, "world_size": 1}'
