"""How the fine-tune's ranks are launched: one node locally, many nodes through torchrun's rendezvous (one launch
per node) or a DeepSpeed hostfile."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from core.errors import ConfigError
from training.config import FinetuneConfig
from training.finetune.launch import DEFAULT_MULTI_NODE_PORT, launch_command


def _cfg(**distributed: object) -> FinetuneConfig:
    return FinetuneConfig.model_validate({"distributed": distributed})


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_one_node_meets_on_loopback_with_world_size_ranks(tmp_path: Path) -> None:
    cmd = launch_command(_cfg(launcher="deepspeed", world_size=2), tmp_path / "job.json")
    assert _flag(cmd, "--master_addr") == "127.0.0.1" and _flag(cmd, "--num_gpus") == "2"
    assert "--hostfile" not in cmd and cmd[-3:] == ["--module", "training.finetune.worker", str(tmp_path / "job.json")]
    torchrun = launch_command(_cfg(world_size=2), tmp_path / "job.json")
    assert "--nproc_per_node=2" in torchrun and "--nnodes=1" in torchrun
    # the agent's store takes a port the OS picks as it binds: no port probed free beforehand for another run to take
    assert "--rdzv-endpoint=127.0.0.1:0" in torchrun and not any(a.startswith("--master_port") for a in torchrun)
    pinned = launch_command(_cfg(world_size=2, master_port=6001), tmp_path / "job.json")
    assert "--master_addr=127.0.0.1" in pinned and "--master_port=6001" in pinned


def test_many_nodes_meet_at_the_hostfiles_first_host_on_a_fixed_port(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# rank 0 lives on the first host\n\nworker-1 slots=8  # 8 GPUs\nworker-2 slots=8\n")
    cmd = launch_command(_cfg(launcher="deepspeed", hostfile=str(hostfile)), tmp_path / "job.json")
    assert _flag(cmd, "--hostfile") == str(hostfile) and "--num_nodes" not in cmd
    # every node is told the same rendezvous: not its own loopback, not a port that was free only here
    assert _flag(cmd, "--master_addr") == "worker-1"
    assert _flag(cmd, "--master_port") == str(DEFAULT_MULTI_NODE_PORT)
    given = _cfg(launcher="deepspeed", hostfile=str(hostfile), master_addr="10.0.0.5", master_port=6000)
    cmd = launch_command(given, tmp_path / "job.json")
    assert _flag(cmd, "--master_addr") == "10.0.0.5" and _flag(cmd, "--master_port") == "6000"


def test_a_hostfile_without_hosts_is_a_config_error(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# nothing yet\n")
    with pytest.raises(ConfigError, match="names no host"):
        launch_command(_cfg(launcher="deepspeed", hostfile=str(hostfile)), tmp_path / "job.json")


def test_a_run_resumes_from_its_committed_checkpoint_only(tmp_path: Path) -> None:
    from training.finetune.launch import resumable_step

    assert resumable_step(tmp_path) == 0  # nothing yet
    (tmp_path / "checkpoints" / "step0000008").mkdir(parents=True)
    assert resumable_step(tmp_path) == 0  # written but not committed (no ``latest``): not resumable
    (tmp_path / "checkpoints" / "latest").write_text("step0000008")
    assert resumable_step(tmp_path) == 8
    (tmp_path / "train_result.json").write_text("{}")
    assert resumable_step(tmp_path) == 0  # finished: read back, not resumed


def test_torchrun_nodes_meet_at_node_0s_address_each_with_its_rank_and_a_report(tmp_path: Path) -> None:
    one = launch_command(_cfg(world_size=2), tmp_path / "job.json")
    assert one[1:4] == ["-m", "training.finetune.node", "--report"] and one[4] == str(
        tmp_path / "nodes" / "node-0.json"
    )
    assert "--nnodes=1" in one and "--node_rank=0" in one
    cfg = _cfg(nnodes=2, world_size=1, master_addr="10.77.0.1", socket_ifname="lc0")
    for rank in (0, 1):
        cmd = launch_command(cfg, tmp_path / "job.json", node_rank=rank)
        assert cmd[4] == str(tmp_path / "nodes" / f"node-{rank}.json")
        torchrun = cmd[cmd.index("--") + 1 :]
        assert torchrun[:5] == [
            "--nnodes=2",
            f"--node_rank={rank}",
            "--nproc_per_node=1",
            "--master_addr=10.77.0.1",
            f"--master_port={DEFAULT_MULTI_NODE_PORT}",  # the same fixed port on every node
        ]
        assert torchrun[-3:] == ["-m", "training.finetune.worker", str(tmp_path / "job.json")]


def test_a_multi_node_run_counts_every_nodes_ranks_and_names_its_interface() -> None:
    from training.finetune.launch import rank_environment, resolve_deepspeed_config

    cfg = FinetuneConfig.model_validate(
        {"micro_batch_size": 4, "distributed": {"nnodes": 3, "world_size": 2, "master_addr": "node0"}}
    )
    _, ds = resolve_deepspeed_config(cfg)
    assert ds["train_batch_size"] == 4 * 3 * 2  # DeepSpeed checks it against the world it finds
    named = cfg.model_copy(update={"distributed": cfg.distributed.model_copy(update={"socket_ifname": "eth1"})})
    env = rank_environment(named, threads=3)
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth1" and env["OMP_NUM_THREADS"] == "3"
    # not configured: the ranks see whatever the user's environment says
    assert rank_environment(cfg, threads=1).get("GLOO_SOCKET_IFNAME") == os.environ.get("GLOO_SOCKET_IFNAME")


@pytest.mark.parametrize(
    ("distributed", "message"),
    [
        ({"nnodes": 2}, "needs master_addr"),
        ({"nnodes": 2, "master_addr": "a", "launcher": "deepspeed"}, "takes its nodes from the hostfile"),
        ({"nnodes": 2, "master_addr": "a", "hostfile": "h"}, "takes its nodes from the hostfile"),
    ],
)
def test_multi_node_settings_that_cannot_work_are_refused(distributed: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        FinetuneConfig.model_validate({"distributed": distributed})
