"""What each launcher sets, copied from real srun, mpirun and torchrun runs (for the tests of
the launch environments)."""

# `srun -n 2 env` on the one-node SLURM of .ci/start-slurm, task 1.
SRUN = {"SLURM_JOB_ID": "2", "SLURM_JOB_NAME": "env", "SLURM_LOCALID": "1", "SLURM_NNODES": "1",
        "SLURM_NODELIST": "localhost", "SLURM_NTASKS": "2", "SLURM_PROCID": "1",
        "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_NUM_NODES": "1",
        "SLURM_STEP_NUM_TASKS": "2"}
# `mpirun --allow-run-as-root --oversubscribe -n 2 env`, rank 1.
MPIRUN = {"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
          "OMPI_COMM_WORLD_NODE_RANK": "1", "OMPI_COMM_WORLD_RANK": "1",
          "OMPI_COMM_WORLD_SIZE": "2", "OMPI_MCA_ess_base_jobid": "1953169409",
          "PMIX_NAMESPACE": "1953169409", "PMIX_RANK": "1"}
# `torchrun --nproc_per_node 2` worker 1, second attempt.
TORCHRUN = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
            "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511",
            "TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "1",
            "TORCHELASTIC_USE_AGENT_STORE": "True"}
