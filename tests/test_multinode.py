"""Two machines simulated on one: two torchrun agents (one process each) joined by a c10d
rendezvous train and evaluate exactly like one agent with two processes."""

from __future__ import annotations

import subprocess
import sys

import torch
from conftest import TWO_RANK_TRAIN, child_env, free_port
from toy_trainer import results, weights


def test_two_agents_equal_one_agent_with_two_processes(toy_folder, two_rank_run, tmp_path):
    port = free_port()
    agents = []
    for node_rank in (0, 1):
        launcher = ["--nnodes=2", f"--node_rank={node_rank}", "--nproc_per_node=1",
                    "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=nlptrain-test"]
        command = [sys.executable, "-m", "torch.distributed.run", *launcher, "-m", "nlptrain",
                   *TWO_RANK_TRAIN, "--output-dir", str(tmp_path / "two-agents")]
        agents.append(subprocess.Popen(command, cwd=toy_folder, env=child_env(), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True))
    outputs = [agent.communicate(timeout=300) for agent in agents]
    for agent, (_, err) in zip(agents, outputs, strict=True):
        assert agent.returncode == 0, err[-2000:]
    assert "launched by torchrun, 2 ranks on 2 nodes" in outputs[0][1] + outputs[1][1]

    one, two = weights(two_rank_run.folder), weights(tmp_path / "two-agents")
    assert all(torch.equal(one[name], two[name]) for name in one)
    assert results(two_rank_run.folder)["test"] == results(tmp_path / "two-agents")["test"]
