"""Each launcher's environment, from exactly the variables it sets (copied from real srun,
mpirun, sbatch and torchrun runs): no processes needed."""

from __future__ import annotations

import pytest
from launch_environs import MPIRUN, SRUN, TORCHRUN

from nlptrain import cli
from nlptrain.environments import (
    Local,
    NlptrainLaunch,
    OpenMPI,
    Slurm,
    TorchElastic,
    detect,
)
from nlptrain.errors import ConfigError
from nlptrain.slurm_nodes import _parse_first_host, first_host


def test_srun_tasks_are_ranks_of_one_job():
    env = detect(SRUN)
    assert isinstance(env, Slurm)
    assert (env.rank, env.world_size, env.local_rank, env.nodes) == (1, 2, 1, 1)
    assert (env.master_addr, env.master_port) == ("localhost", 15002)  # Lightning's rule
    assert env.run_id == "slurm-2" and env.restart_count == 0 and not env.uses_agent_store
    assert env.describe().startswith("launched by SLURM, 2 ranks on 1 node")


def test_each_launch_tells_its_rendezvous_from_another_jobs():
    """Two srun steps of one allocation share the job id's port: the step id tells them apart."""
    assert detect(SRUN).rendezvous_id == "slurm-2.0"
    assert detect({**SRUN, "SLURM_STEP_ID": "1"}).rendezvous_id == "slurm-2.1"
    assert detect(MPIRUN).rendezvous_id == "1953169409"
    assert detect(TORCHRUN).rendezvous_id == "abc"
    assert detect({"RANK": "1", "WORLD_SIZE": "2"}).rendezvous_id is None  # env:// by hand


def test_slurm_on_many_nodes_meets_on_the_first_host():
    env = detect({**SRUN, "SLURM_JOB_ID": "123456", "SLURM_STEP_NUM_TASKS": "8",
                  "SLURM_NTASKS": "8", "SLURM_STEP_NUM_NODES": "2", "SLURM_NNODES": "2",
                  "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_NODELIST": "gpu[07-08]"})
    assert env.master_addr == "gpu07" and env.master_port == 15000 + 3456
    assert env.describe().startswith("launched by SLURM, 8 ranks on 2 nodes")
    assert detect({**SRUN, "MASTER_ADDR": "head", "MASTER_PORT": "2222"}).master_port == 2222


@pytest.mark.parametrize(("nodelist", "first"), [
    ("localhost", "localhost"), ("node[01-04],other", "node01"), ("a,b[1-2]", "a"),
    ("gpu[7,9-10]", "gpu7"), ("rack1-n[003-010]", "rack1-n003"),
    ("rack[1-2]-n[3-4]", "rack1-n3"), ("a[1-2]b[03-04],c", "a1b03")])  # (a name went at its "]")
def test_first_host_of_a_node_list(nodelist, first):
    assert _parse_first_host(nodelist) == first
    assert first_host(nodelist) == first  # scontrol show hostnames, where installed


def test_an_sbatch_script_itself_is_one_process():
    """The batch step has SLURM_PROCID=0 and SLURM_NTASKS=N but is no srun step: rank 0 of N
    would wait forever for N-1 ranks that never start."""
    batch = {"SLURM_JOB_ID": "3", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"}
    assert isinstance(detect(batch), Local) and detect(batch).world_size == 1


def test_mpirun_ranks_are_ranks_of_one_job():
    env = detect(MPIRUN)
    assert isinstance(env, OpenMPI)
    assert (env.rank, env.world_size, env.local_rank, env.nodes) == (1, 2, 1, 1)
    assert env.master_addr == "127.0.0.1"
    # The port follows the mpirun's job id: the same on every rank, another for another mpirun.
    assert 15000 <= env.master_port < 35000
    assert env.master_port == detect({**MPIRUN, "OMPI_COMM_WORLD_RANK": "0"}).master_port
    assert env.master_port != detect({**MPIRUN, "OMPI_MCA_ess_base_jobid": "42"}).master_port
    moved = detect({**MPIRUN, "MASTER_ADDR": "host0", "MASTER_PORT": "2345"})
    assert (moved.master_addr, moved.master_port) == ("host0", 2345)


def test_mpirun_inside_a_slurm_allocation_is_open_mpi():
    """mpirun starts its daemons with srun: its ranks see the daemon's SLURM_PROCID too."""
    env = detect({**SRUN, "SLURM_PROCID": "0", **MPIRUN})
    assert isinstance(env, OpenMPI) and env.rank == 1


def test_torchrun_and_launchers_of_its_convention():
    env = detect(TORCHRUN)
    assert type(env) is TorchElastic and env.name == "torchrun"
    assert (env.rank, env.world_size, env.local_rank, env.nodes) == (1, 2, 1, 1)
    assert (env.restart_count, env.run_id, env.uses_agent_store) == (1, "abc", True)
    # torchrun inside an srun step: torchrun's ranks, not SLURM's tasks.
    assert type(detect({**SRUN, **TORCHRUN})) is TorchElastic
    # nlptrain's --nproc: torchrun's agent, marked.
    assert isinstance(detect({**TORCHRUN, "NLPTRAIN_LAUNCHER": "nproc"}), NlptrainLaunch)
    # The deepspeed launcher / torch.distributed.launch without --use-env: env:// plus --local_rank.
    plain = {"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    assert detect(plain).name == "env:// (RANK, WORLD_SIZE)"
    assert detect(plain, local_rank=1).local_rank == 1 and detect(plain).local_rank == 3
    assert detect({**plain, "LOCAL_RANK": "0"}, local_rank=1).local_rank == 0


def test_no_launcher_is_one_process():
    env = detect({})
    assert isinstance(env, Local) and (env.rank, env.world_size, env.restart_count) == (0, 1, 0)
    assert detect({}, local_rank=2).local_rank == 2


def test_a_bad_value_names_the_variable(capsys):
    with pytest.raises(ConfigError, match=r"\$SLURM_PROCID='x' is not a number"):
        _ = detect({**SRUN, "SLURM_PROCID": "x"}).rank
    # The command line says it in one line, as it says every other bad launcher setting.
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "abc"}.items():
            patch.setenv(name, value)
        assert cli.main(["train"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "error: env:// (RANK, WORLD_SIZE): $MASTER_PORT='abc' is not a number; check the launcher's settings"


@pytest.mark.parametrize(("environ", "told"), [
    ({"WORLD_SIZE": "2"}, r"\$WORLD_SIZE=2 is set but \$RANK is not"),
    ({"RANK": "1"}, r"\$RANK=1 is set but \$WORLD_SIZE is not"),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"},
     r"\$SLURM_PROCID=1 without \$SLURM_STEP_ID: not a task of an srun step"),
    ({"RANK": "2", "WORLD_SIZE": "2"},
     r"rank 2 in a world of 2 \(ranks run from 0 to 1\) \[\$RANK=2, \$WORLD_SIZE=2\]"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, r"a world size of 0 \(it must be at least 1\)"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1"}, r"local rank -1 \(it must be 0 or more\)"),
    ({**SRUN, "SLURM_PROCID": "2"}, r"SLURM: rank 2 in a world of 2 .*\$SLURM_PROCID=2"),
    ({**MPIRUN, "OMPI_COMM_WORLD_RANK": "-1"}, r"Open MPI: rank -1 in a world of 2"),
    ({**SRUN, "MASTER_PORT": "70000"}, r"SLURM: a rendezvous port of 70000 \(it must be 1 to 65535"),
    ({"RANK": "", "WORLD_SIZE": "2"}, r"^env:// \(RANK, WORLD_SIZE\): \$RANK is set but empty"),
    ({**SRUN, "SLURM_PROCID": ""}, r"^SLURM: \$SLURM_PROCID is set but empty"),  # (a KeyError)
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, r"\$PMI_SIZE=2: started by an MPI launcher nlptrain does "
                                         r"not read \(MPICH"),  # (two jobs of one process each)
    ({**SRUN, "PMI_RANK": "3", "PMI_SIZE": "8"}, r"\$PMI_SIZE=8 in a SLURM step of 2 task\(s\): "
                                                 r"an MPI launcher"),  # (ranks of its proxy's task)
])
def test_a_place_no_job_has_is_refused_naming_the_variables(environ, told):
    """Else one rank waits out the timeout for a rendezvous that never completes, or N
    processes each train a job of their own (WORLD_SIZE without RANK)."""
    with pytest.raises(ConfigError, match=told):
        detect(environ)
    assert detect({"WORLD_SIZE": "1"}).world_size == detect({"RANK": "0"}).world_size == 1
    assert detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}).world_size == 1  # a batch script
    assert detect({**SRUN, "PMI_RANK": "1", "PMI_SIZE": "2"}).rank == 1  # srun --mpi=pmi2


def test_cli_says_a_bad_launch_environment_in_one_line(monkeypatch, capsys):
    for name, value in {"RANK": "3", "WORLD_SIZE": "2", "LOCAL_RANK": "3"}.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["train"]) == 1
    assert capsys.readouterr().err == ("error: env:// (RANK, WORLD_SIZE): rank 3 in a world of 2 "
                                       "(ranks run from 0 to 1) [$RANK=3, $WORLD_SIZE=2, "
                                       "$LOCAL_RANK=3]; check the launcher's settings\n")


@pytest.mark.parametrize("argv", [["--local_rank=1", "train"], ["--local-rank", "1", "train"],
                                  ["train", "--local_rank=1"]])
def test_cli_takes_the_local_rank_argument_of_older_launchers(argv, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    args = cli.build_parser().parse_args(argv)
    assert cli.launch_environment(args).local_rank == 1


def test_nproc_inside_another_launcher_is_refused(monkeypatch, capsys):
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["train", "--nproc", "2"]) == 1
    assert "already one of 2 ranks (torchrun); drop --nproc" in capsys.readouterr().err


def test_open_mpi_5s_ranks_tell_their_job_by_its_pmix_namespace():
    """Open MPI 5 sets no ess_base_jobid: a rank of one mpirun joined another's rendezvous (the
    same MASTER_PORT) and trained in it, unsaid."""
    five = {k: v for k, v in MPIRUN.items() if k != "OMPI_MCA_ess_base_jobid"}
    assert detect({**five, "PMIX_NAMESPACE": "prterun-vm-81@1"}).rendezvous_id == "prterun-vm-81@1"
    assert detect({**five, "PMIX_NAMESPACE": "prterun-vm-81@1"}).rendezvous_id != \
        detect({**five, "PMIX_NAMESPACE": "prterun-vm-92@1"}).rendezvous_id


def test_ranks_on_several_machines_with_no_address_to_meet_at_are_refused():
    """Open MPI on 2 machines without MASTER_ADDR met each on its own localhost, and waited out
    the timeout blaming rank 0."""
    apart = {**MPIRUN, "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}
    with pytest.raises(ConfigError, match=r"^Open MPI: 2 machines and no address to meet at \(set "
                                          r"MASTER_ADDR to rank 0's host, for every rank\)"):
        detect(apart)
    assert detect({**apart, "MASTER_ADDR": "host0"}).master_addr == "host0"


def test_one_task_of_an_srun_step_is_a_process_alone():
    """An interactive shell in an allocation (`srun --pty bash`) is such a step: `--resume` of an
    `--nproc 2` run went on in one process there, with half the batch."""
    one = {**SRUN, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1",
           "SLURM_STEP_NUM_TASKS": "1"}
    assert detect(one).started_alone and not detect(SRUN).started_alone


def test_a_rank_left_waiting_for_the_others_says_so_in_one_line(monkeypatch, capsys):
    """Rank 0 of 2 alone (rank 1 never starts): the rendezvous gives up after --timeout, and
    the error says that no rank answered, not that one failed (none said a word), and which."""
    from conftest import free_port

    from nlptrain.distributed import peer_failure_in, timed_out

    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["train", "--timeout", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no answer from the other rank(s) in time (Timed out after 1 s "
                          "waiting for rank(s) 1 of 2 to join the job at 127.0.0.1:"), err
    assert err.endswith("--timeout (eval: --set train.timeout=SECONDS) sets how long ranks wait "
                        "for each other\n")
    # A DDP all-reduce that times out in the backward is a plain RuntimeError (the gloo text).
    recv = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer."
                        "cc:78] Timed out waiting 20000ms for recv operation to complete")
    closed = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
                          "by peer [127.0.0.1]:41892")
    assert timed_out(recv) and not timed_out(closed) and peer_failure_in(closed) is not None


def test_a_rank_at_a_store_no_job_claims_says_it_waited_in_vain(monkeypatch, capsys):
    """SLURM rank 1 reaches a store that no nlptrain rank 0 claims (another program's, or an
    older nlptrain's): after --timeout it says that no rank answered, not that one failed."""
    import torch.distributed as dist
    from conftest import free_port

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False)
    for name, value in {**SRUN, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["train", "--timeout", "1"]) == 1
    err = capsys.readouterr().err
    assert "error: no answer from the other rank(s) in time (wait timeout after 1000ms" in err, err
    del store


@pytest.mark.parametrize("launcher", ["env://", "SLURM"])
def test_a_rank_at_a_port_that_takes_the_connection_and_never_answers_ends_at_the_timeout(
        monkeypatch, capsys, launcher):
    """An HTTP server at MASTER_PORT: torch's store client waited on it forever, --timeout
    unheeded (rank 0 of a SLURM job said the port was taken; rank 1 hung)."""
    import socket
    import threading
    import time

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    taken: list = []
    threading.Thread(target=lambda: [taken.append(server.accept()) for _ in range(8)],
                     daemon=True).start()
    place = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.getsockname()[1])}
    launch = {"RANK": "1", "WORLD_SIZE": "2"} if launcher == "env://" else {**SRUN}
    for name, value in {**launch, **place}.items():
        monkeypatch.setenv(name, value)
    began = time.monotonic()
    assert cli.main(["train", "--timeout", "2"]) == 1
    assert time.monotonic() - began < 30
    err = capsys.readouterr().err
    assert "took the connection but never answered in 2 s: a program other than the job's store " \
        "listens there" in err, err
    server.close()


def test_a_client_still_retrying_where_nothing_listens_is_no_answer_not_a_foreign_program():
    """torch's store client retries with pauses that may outlast the timeout (seen at 12 s:
    17 s): with nothing at the port (rank 0 not started, or ended) that was said as a program
    other than the job's store listening there."""
    from datetime import timedelta

    from conftest import free_port

    from nlptrain.distributed import timeout_message
    from nlptrain.rendezvous import _unanswered

    said = _unanswered(1, "127.0.0.1", free_port(), timedelta(seconds=12))
    assert timeout_message(said).startswith("no answer from the other rank(s) in time (Timed out "
                                            "after 12 s waiting for the job's store at 127.0.0.1:")
    assert "nothing listens there (rank 0 not started, or ended)" in str(said)


def test_a_peers_failure_under_a_dataloader_workers_end_is_one_line():
    """Rank 1 killed, rank 0 with DataLoader workers: gloo's "reset by peer" is the context of
    "DataLoader worker ... is killed by signal: Terminated" (the workers end as rank 0 unwinds);
    it was printed as both tracebacks, not as the one line of a peer's failure."""
    from nlptrain.distributed import PeerFailed, as_peer_failure, peer_failure_in

    try:
        try:
            raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
                               "[127.0.0.1]:5533: Connection reset by peer")
        except RuntimeError:
            raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Terminated. ")  # noqa: B904 (as torch raises it)
    except RuntimeError as error:
        outer = error
    said = as_peer_failure(outer, 0, 2)
    assert isinstance(said, PeerFailed) and peer_failure_in(outer) is not None
    assert str(said) == ("another rank failed (see its error); rank 0 stopped at step 2 ([../third"
                         "_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:5533:"
                         " Connection reset by peer)")
    assert as_peer_failure(RuntimeError("DataLoader worker (pid 4242) is killed by signal: "
                                        "Terminated. "), 0, 2) is None  # its own: as it is


@pytest.mark.parametrize("given, named", [({"MASTER_ADDR": "nosuchhost.invalid"}, "MASTER_ADDR"),
                                          ({"SLURM_STEP_NODELIST": "nosuchhost.invalid"},
                                           "rank 0's host")])
def test_a_rendezvous_host_that_does_not_resolve_is_named_at_once(monkeypatch, capsys, given, named):
    """It was a timeout blamed on the other ranks, with advice to raise --timeout."""
    for name, value in {**SRUN, **given}.items():
        monkeypatch.setenv(name, value)
    if "MASTER_ADDR" not in given:  # (SLURM's node list names it)
        monkeypatch.delenv("MASTER_ADDR", raising=False)
    assert cli.main(["train", "--timeout", "30"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"[rank 1] error: the rendezvous host nosuchhost.invalid "
                          f"({named}) does not resolve ("), err
    assert err.endswith("); set MASTER_ADDR to rank 0's host name or address\n"), err


@pytest.mark.distributed
def test_a_process_group_of_ones_own_is_joined_not_taken_for_one_process(monkeypatch, tmp_path,
                                                                        tiny_model_dir):
    """An mp.spawn script: init_process_group(rank=r, world_size=2) with no launcher's
    variables, then a DistTrainer. Each process took itself for a job of one and trained all
    24 rows alone (6 steps); now they are the group's 2 ranks (3 steps each), and the group is
    left to its maker."""
    import torch.multiprocessing as mp
    from conftest import free_port
    from ddp import own_group_worker

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    results = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(own_group_worker, args=(2, tiny_model_dir, tmp_path, results), nprocs=2,
                       start_method="spawn")
    assert sorted(results.get() for _ in range(2)) == [(0, 2, 3, True), (1, 2, 3, True)]


@pytest.mark.parametrize(("launcher_is_parent", "platform", "ends"),
                         [(True, "linux", False), (False, "linux", True), (False, "win32", False)])
def test_an_nproc_worker_whose_launcher_died_before_it_was_tied_ends(launcher_is_parent, platform,
                                                                      ends):
    """The parent-death signal is set after the imports: an agent SIGKILLed in those seconds
    sent nothing, and both workers waited out --timeout in the rendezvous (review 121). Off
    Linux nothing is checked (Windows' os.kill(pid, 0) would end the launcher)."""
    import os
    import subprocess
    import sys

    from nlptrain.environments import LAUNCHER_MARK, LAUNCHER_PID

    ended = subprocess.Popen(["true"])  # reaped below: its pid is no process now
    ended.wait()
    environ = {**os.environ, **TORCHRUN, LAUNCHER_MARK: "nproc",
               LAUNCHER_PID: str(os.getpid() if launcher_is_parent else ended.pid)}
    worker = subprocess.run(
        [sys.executable, "-c", "import sys\nfrom nlptrain.environments import detect\n"
                               f"sys.platform = {platform!r}\n"
                               "detect().tie_to_launcher()\nprint('went on')"],
        env=environ, capture_output=True, text=True, timeout=60)
    assert (worker.returncode == -15) == ends, worker.stderr
    assert ("went on" in worker.stdout) != ends
