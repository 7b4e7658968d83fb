"""Where a process learns its place in a job: rank, world size, local rank, master address and
port, restart count, run id. One class per launcher behind one interface (as Lightning's
`ClusterEnvironment`), detected in one place, `detect()`; nothing else in nlptrain reads these
variables. `TorchElastic`: torchrun and any launcher of its `env://` convention (RANK,
WORLD_SIZE); `NlptrainLaunch`: `--nproc N` / `launch()`, torch's elastic agent with nlptrain's
mark; `Slurm`: a task of an `srun` step; `OpenMPI`: an `mpirun` rank; `OwnProcessGroup`: a
process group the user made (an `mp.spawn` script); `Local`: none of them, one process. Each
reads a mapping (`os.environ` by default), so tests can hand it exactly what a launcher sets.
"""

from __future__ import annotations

import os
import signal
import sys
import zlib
from collections.abc import Mapping

from nlptrain.errors import ConfigError
from nlptrain.processes import alive, end_with_parent
from nlptrain.slurm_nodes import first_host, slurm_job_id

# Set by nlptrain's own launcher in the workers it starts (see nlptrain/launch.py).
LAUNCHER_MARK = "NLPTRAIN_LAUNCHER"
LAUNCHER_PID = "NLPTRAIN_LAUNCHER_PID"  # the --nproc agent's process, its workers' parent
DEFAULT_PORT = 29500


class Environment:
    """A process's place in its job, as one launcher tells it. Subclasses say how to read it."""

    name = "a launcher"
    variables: tuple[str, ...] = ()  # rank, world size, local rank: named in `check`'s errors

    def __init__(self, environ: Mapping[str, str] | None = None, local_rank: int | None = None):
        self.environ = dict(os.environ if environ is None else environ)
        # `--local_rank=N` on the command line (torch.distributed.launch without --use-env, the
        # deepspeed launcher): used where the environment has no local rank of its own.
        self.local_rank_argument = local_rank

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        raise NotImplementedError

    def _int(self, name: str, default: int | None = None) -> int:
        value = self.environ.get(name)
        if value == "" and default is None:  # `export RANK=$SLURM_PROCID` where that is unset
            raise ConfigError(f"{self.name}: ${name} is set but empty; check the launcher's "
                              "settings (or the script that exports it)")
        if value is None or value == "":
            if default is None:
                raise KeyError(f"{self.name}: ${name} is not set")
            return default
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{self.name}: ${name}={value!r} is not a number; check the "
                              "launcher's settings") from None

    # The interface; subclasses override what their launcher tells (some as one-line properties).
    @property
    def rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def nodes(self) -> int:
        return 1

    @property
    def restart_count(self) -> int:
        """How often the launcher restarted the job (torchrun's attempts, SLURM's requeues)."""
        return 0

    @property
    def run_id(self) -> str | None:
        """The launch's id: a restarted job has the same one."""
        return None

    # The scheduler's job the launch runs in (SLURM's), which a requeued job keeps: what tells its
    # run after a requeue where the launch's own id is new.
    job_id: str | None = None
    requeued = property(lambda self: self.job_id is not None and self._int("SLURM_RESTART_COUNT", 0) > 0)

    @property
    def rendezvous_id(self) -> str | None:
        """What tells this job's ranks from another job's given the same rendezvous port (the
        launch's id; under SLURM, with the step's); None where the launcher gives none."""
        return self.run_id

    @property
    def uses_agent_store(self) -> bool:
        """Join the launcher's TCPStore as a client (torchrun's agent hosts it)."""
        return False

    @property
    def has_agent(self) -> bool:
        """Started by torch's elastic agent (torchrun, `--nproc`), which SIGTERMs every worker
        when one fails, and says so itself when it is stopped."""
        return False

    @property
    def local_rank(self) -> int:
        return self.local_rank_argument if self.local_rank_argument is not None else 0

    @property
    def master_addr(self) -> str:
        return self.environ.get("MASTER_ADDR") or "127.0.0.1"

    @property
    def master_port(self) -> int:
        return self._int("MASTER_PORT", DEFAULT_PORT)

    @property
    def started_alone(self) -> bool:
        """One plain process: no launcher of several started it (none, or a one-task srun step,
        as an interactive shell in an allocation has) and no process group holds it."""
        return False

    @property
    def is_nproc_worker(self) -> bool:
        """A worker that nlptrain's own `--nproc N` (or `launch()`) started."""
        return False

    def _local_rank_or(self, fallback: int) -> int:
        """$LOCAL_RANK, else `--local_rank=N`, else `fallback`."""
        given = self.local_rank_argument
        return self._int("LOCAL_RANK", given if given is not None else fallback)

    def _nodes_of(self, per_node: int) -> int:
        """The nodes the world fills at `per_node` ranks each (the last may hold fewer)."""
        return max(1, -(-self.world_size // max(per_node, 1)))

    def _port_or(self, derived: int) -> int:
        """$MASTER_PORT where set, else a port derived from the job (two jobs on a host differ)."""
        return self._int("MASTER_PORT") if self.environ.get("MASTER_PORT") else derived

    def tie_to_launcher(self) -> None:
        """Make this process end with the launcher that started it, where the launcher is its
        parent and does not end it by itself when killed (SIGKILL: no time to stop anyone)."""

    def check(self) -> Environment:
        """Refuse a place that no job has (a launcher's or a user's mistake): it would wait for
        ranks that never come, or two ranks would take the same place."""
        rank, world, local = self.rank, self.world_size, self.local_rank
        problem = (f"a world size of {world} (it must be at least 1)" if world < 1 else
                   f"rank {rank} in a world of {world} (ranks run from 0 to {world - 1})"
                   if not 0 <= rank < world else
                   f"local rank {local} (it must be 0 or more)" if local < 0 else
                   f"a rendezvous port of {self.master_port} (it must be 1 to 65535; MASTER_PORT)"
                   if world > 1 and not 0 < self.master_port < 65536 else  # each machine's ranks
                   f"{self.nodes} machines and no address to meet at (set MASTER_ADDR to rank 0's "
                   "host, for every rank)" if self.nodes > 1 and self.master_addr == "127.0.0.1"
                   else None)  # would meet apart, and wait for the others until the timeout
        if problem:
            told = ", ".join(f"${k}={self.environ[k]}" for k in self.variables if k in self.environ)
            raise ConfigError(f"{self.name}: {problem}"
                              f"{f' [{told}]' if told else ''}; check the launcher's settings")
        return self

    def describe(self) -> str:
        """The line rank 0 logs once: "launched by SLURM, 8 ranks on 2 nodes"."""
        ranks = f"{self.world_size} rank{'s' if self.world_size != 1 else ''}"
        nodes = f" on {self.nodes} node{'s' if self.nodes != 1 else ''}"
        restart = f" (restart {self.restart_count})" if self.restart_count else ""
        where = f", rendezvous at {self.master_addr}:{self.master_port}" if self.world_size > 1 else ""
        return f"launched by {self.name}, {ranks}{nodes}{restart}{where}"

    def record(self) -> dict[str, object]:
        """What config.json keeps of the launch."""
        return {"launcher": self.name, "world_size": self.world_size, "nodes": self.nodes,
                "run_id": self.run_id, "restart_count": self.restart_count}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size}, "
                f"local_rank={self.local_rank}, master={self.master_addr}:{self.master_port})")


class Local(Environment):
    """No launcher: one process. (`accelerate launch --cpu --num_processes N` without an MPI
    hostfile also starts one process: it is named, and the world size stays an honest 1.)"""

    started_alone = True  # type: ignore[assignment]

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        return True

    @property
    def name(self) -> str:  # type: ignore[override]
        return "accelerate launch" if "ACCELERATE_MIXED_PRECISION" in self.environ else "no launcher"

    def describe(self) -> str:
        return "no launcher: 1 process" if self.name == "no launcher" else \
            f"launched by {self.name}, 1 process"


class OwnProcessGroup(Environment):
    """No launcher's variables, but a process group the user made (`init_process_group` with a
    rank and world size, as `mp.spawn` scripts do): its rank and world size. (Found as one
    process, each of the N trained a job of its own.) The group stays the user's to end."""

    name = "your own init_process_group"
    variables = ("init_process_group(rank=, world_size=)",)

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        dist = sys.modules.get("torch.distributed")  # not imported: no group was made
        return dist is not None and dist.is_available() and dist.is_initialized()

    rank = property(lambda self: sys.modules["torch.distributed"].get_rank())
    world_size = property(lambda self: sys.modules["torch.distributed"].get_world_size())

    @property
    def local_rank(self) -> int:  # mp.spawn: one machine, its process index
        return self._local_rank_or(self.rank)

    def describe(self) -> str:
        return f"{self.world_size} rank(s) of your own init_process_group"


class TorchElastic(Environment):
    """torchrun (its elastic agent), or any launcher of the `env://` convention."""

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        return "RANK" in environ and "WORLD_SIZE" in environ

    variables = ("RANK", "WORLD_SIZE", "LOCAL_RANK")

    @property
    def name(self) -> str:  # type: ignore[override]
        return "torchrun" if "TORCHELASTIC_RUN_ID" in self.environ else "env:// (RANK, WORLD_SIZE)"

    rank = property(lambda self: self._int("RANK"))
    world_size = property(lambda self: self._int("WORLD_SIZE"))
    uses_agent_store = property(lambda self: self.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True")

    job_id = property(lambda self: slurm_job_id(self.environ))  # `srun torchrun ...`'s job

    @property
    def restart_count(self) -> int:
        # torchrun (or --nproc) in a SLURM job: a requeued job starts it anew, at attempt 0 (and
        # with a new run id: its job id tells the run it began), a restart all the same.
        return self._int("TORCHELASTIC_RESTART_COUNT", 0) + self._int("SLURM_RESTART_COUNT", 0)

    @property
    def run_id(self) -> str | None:
        # torchrun's default --rdzv-id, "none", also under a static rendezvous (--master-port), is
        # the same for every launch: it names none of them.
        value = self.environ.get("TORCHELASTIC_RUN_ID")
        return value if value not in (None, "", "none") else None

    @property
    def local_rank(self) -> int:
        return self._local_rank_or(self.rank)

    @property
    def has_agent(self) -> bool:
        return "TORCHELASTIC_RESTART_COUNT" in self.environ  # (not a hand-set env:// launch)

    def tie_to_launcher(self) -> None:
        # torch's elastic agent (torchrun, `--nproc`) starts each worker in a session of its own
        # and stops them when it exits, but a SIGKILLed agent stops nobody: its workers would
        # train on unwatched, writing into the run folder. The kernel sends them SIGTERM instead
        # (Linux's parent-death signal), which stops them after the step, with a checkpoint.
        if "TORCHELASTIC_RESTART_COUNT" in self.environ and sys.platform == "linux":
            end_with_parent(signal.SIGTERM)
            # An agent killed before that (the seconds of the imports) sends nothing: the
            # workers waited out the rendezvous timeout, orphans. `--nproc` names its agent
            # (not always the parent: a forkserver's workers are the fork server's children).
            launcher = self.environ.get(LAUNCHER_PID, "")
            if launcher.isdigit() and not alive(int(launcher)):
                os.kill(os.getpid(), signal.SIGTERM)

    @property
    def nodes(self) -> int:
        if "GROUP_WORLD_SIZE" in self.environ:  # torchrun: the number of agents
            return self._int("GROUP_WORLD_SIZE")
        return self._nodes_of(self._int("LOCAL_WORLD_SIZE", self.world_size))


class NlptrainLaunch(TorchElastic):
    """A worker of `nlptrain ... --nproc N` or `nlptrain.launch.launch()` (torch's elastic agent)."""

    name = "nlptrain --nproc"  # type: ignore[assignment]
    is_nproc_worker = True  # type: ignore[assignment]

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        return TorchElastic.detect(environ) and environ.get(LAUNCHER_MARK) == "nproc"


class Slurm(Environment):
    """A task of an `srun` step. A batch script itself (sbatch, no srun) has `SLURM_PROCID=0` and
    `SLURM_NTASKS=N` but no step id: it is one process, not rank 0 of N, so it is not detected."""

    name = "SLURM"
    variables = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_LOCALID")

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        return all(k in environ for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID"))

    rank = property(lambda self: self._int("SLURM_PROCID"))
    world_size = property(lambda self: self._int("SLURM_STEP_NUM_TASKS", self._int("SLURM_NTASKS")))
    local_rank = property(lambda self: self._int("SLURM_LOCALID", 0))
    nodes = property(lambda self: self._int("SLURM_STEP_NUM_NODES", self._int("SLURM_NNODES", 1)))
    # A requeued job (scontrol requeue, --requeue after a node failure) keeps its job id.
    restart_count = property(lambda self: self._int("SLURM_RESTART_COUNT", 0))

    run_id = job_id = property(lambda self: slurm_job_id(self.environ))
    started_alone = property(lambda self: self.world_size == 1)

    @property
    def rendezvous_id(self) -> str | None:
        # Two srun steps of one allocation share its job id, hence its port (master_port).
        job = self.run_id
        return f"{job}.{self.environ['SLURM_STEP_ID']}" if job else None

    @property
    def master_addr(self) -> str:
        if self.environ.get("MASTER_ADDR"):
            return self.environ["MASTER_ADDR"]
        nodelist = self.environ.get("SLURM_STEP_NODELIST") or self.environ.get("SLURM_NODELIST")
        return first_host(nodelist) if nodelist else "127.0.0.1"

    @property
    def master_port(self) -> int:
        # As Lightning: the job id's last 4 digits + 15000, so two jobs sharing a node differ.
        job = self.environ.get("SLURM_JOB_ID", "")
        return self._port_or(15000 + int(job[-4:]) if job.isdigit() else 12910)


class OpenMPI(Environment):
    """A rank started by Open MPI's `mpirun`. Open MPI knows no rendezvous address for torch:
    `MASTER_ADDR` (default localhost; set it across machines: `mpirun -x MASTER_ADDR=host0`) and
    `MASTER_PORT` (default derived from the mpirun's job id, so two mpiruns on a host differ)."""

    name = "Open MPI"
    variables = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK")

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        return "OMPI_COMM_WORLD_RANK" in environ and "OMPI_COMM_WORLD_SIZE" in environ

    rank = property(lambda self: self._int("OMPI_COMM_WORLD_RANK"))
    world_size = property(lambda self: self._int("OMPI_COMM_WORLD_SIZE"))
    local_rank = property(lambda self: self._int("OMPI_COMM_WORLD_LOCAL_RANK", 0))
    # Open MPI 4's job id; Open MPI 5 (PRRTE) names the job by its PMIx namespace.
    run_id = property(lambda self: self.environ.get("OMPI_MCA_ess_base_jobid") or
                      self.environ.get("PMIX_NAMESPACE"))

    @property
    def nodes(self) -> int:
        return self._nodes_of(self._int("OMPI_COMM_WORLD_LOCAL_SIZE", self.world_size))

    @property
    def master_port(self) -> int:
        job = self.run_id
        return self._port_or(15000 + zlib.crc32(job.encode()) % 20000 if job else DEFAULT_PORT)


# First match wins. torchrun before the others: torchrun inside an srun step or an mpirun sets
# RANK itself. Open MPI before SLURM: mpirun inside an allocation starts its daemons with srun,
# so its ranks also see SLURM_PROCID (the daemon's, one per node, not the rank).
ENVIRONMENTS: tuple[type[Environment], ...] = (NlptrainLaunch, TorchElastic, OpenMPI, Slurm,
                                                  OwnProcessGroup, Local)


def detect(environ: Mapping[str, str] | None = None, local_rank: int | None = None) -> Environment:
    """The environment of this process (from `os.environ` unless `environ` is given)."""
    values = os.environ if environ is None else environ
    kind = next(cls for cls in ENVIRONMENTS if cls.detect(values))
    if kind is Local:
        _refuse_half_env(values)
    found = kind(values, local_rank).check()
    pmi_size = values.get("PMI_SIZE", "")
    if kind is Slurm and pmi_size.isdigit() and int(pmi_size) != found.world_size:
        # Intel MPI / MPICH start one proxy a node with srun: each rank sees the proxy's task.
        raise ConfigError(f"$PMI_SIZE={pmi_size} in a SLURM step of {found.world_size} task(s): "
                          "an MPI launcher (MPICH, Intel MPI) started these processes, and each "
                          "would take its srun task's rank; start the ranks with srun -n N "
                          "(or torchrun), not mpirun, inside the allocation")
    return found


def _refuse_half_env(environ: Mapping[str, str]) -> None:
    """WORLD_SIZE without RANK (or RANK without WORLD_SIZE), or a SLURM task rank outside an
    srun step: no launcher sets one alone, and as one process each of the N started would train
    a job of its own."""
    for given, lacking, alone_ok in (("WORLD_SIZE", "RANK", "1"), ("RANK", "WORLD_SIZE", "0")):
        if environ.get(given, alone_ok) != alone_ok and lacking not in environ:
            raise ConfigError(f"${given}={environ[given]} is set but ${lacking} is not: a launcher "
                              f"of the env:// convention (torchrun) sets both; set ${lacking} too, "
                              f"or unset ${given} to run one process")
    # MPICH, Intel MPI, MVAPICH (Hydra's PMI): not read, so each rank would train a job alone.
    if environ.get("PMI_SIZE", "1") not in ("", "1"):
        raise ConfigError(f"$PMI_SIZE={environ['PMI_SIZE']}: started by an MPI launcher nlptrain "
                          "does not read (MPICH, Intel MPI, MVAPICH); as one process each rank "
                          "would train a job of its own. Use Open MPI's mpirun, srun or torchrun, "
                          "or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for each rank")
    # srun sets the step id with the task's rank; a batch script is task 0 of no step.
    if environ.get("SLURM_PROCID", "0") != "0" and "SLURM_STEP_ID" not in environ:
        raise ConfigError(f"$SLURM_PROCID={environ['SLURM_PROCID']} without $SLURM_STEP_ID: not "
                          "a task of an srun step, and as one process each task would train a "
                          "job of its own; start the tasks with srun")
