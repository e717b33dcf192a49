"""How the fine-tune's ranks are launched: one node locally, many nodes through a DeepSpeed hostfile."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError
from training.config import FinetuneConfig
from training.finetune import DEFAULT_MULTI_NODE_PORT, launch_command


def _cfg(**distributed: object) -> FinetuneConfig:
    return FinetuneConfig.model_validate({"distributed": distributed})


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_one_node_meets_on_loopback_with_world_size_ranks(tmp_path: Path) -> None:
    cmd = launch_command(_cfg(launcher="deepspeed", world_size=2), tmp_path / "job.json")
    assert _flag(cmd, "--master_addr") == "127.0.0.1" and _flag(cmd, "--num_gpus") == "2"
    assert "--hostfile" not in cmd and cmd[-3:] == ["--module", "training.worker", str(tmp_path / "job.json")]
    torchrun = launch_command(_cfg(world_size=2), tmp_path / "job.json")
    assert "--nproc_per_node=2" in torchrun and "--master_addr=127.0.0.1" in torchrun


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
    from training.finetune import resumable_step

    assert resumable_step(tmp_path) == 0  # nothing yet
    (tmp_path / "checkpoints" / "step0000008").mkdir(parents=True)
    assert resumable_step(tmp_path) == 0  # written but not committed (no ``latest``): not resumable
    (tmp_path / "checkpoints" / "latest").write_text("step0000008")
    assert resumable_step(tmp_path) == 8
    (tmp_path / "train_result.json").write_text("{}")
    assert resumable_step(tmp_path) == 0  # finished: read back, not resumed
