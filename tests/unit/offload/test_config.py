"""ZeRO-Offload's switches: what is refused, with one clear error each (TrainConfig and CLI)."""
from __future__ import annotations

import pytest

from tests.support.cli import assert_usage_error
from zerospec.model.gpt import ODD
from zerospec.training.config import TrainConfig
from zerospec.training.sections import OffloadOptions


@pytest.mark.parametrize("kw, named", [
    ({"stage": 1, "offload_optimizer": "cpu"}, "needs stage 2 or 3, got stage=1"),
    ({"stage": 2, "offload_optimizer": "gpu"}, "offload_optimizer must be one of cpu, nvme"),
    ({"stage": 2, "offload_optimizer": "cpu", "offload_mode": "zero"}, "offload_mode must be"),
    ({"stage": 2, "offload_params": "cpu"}, "offload_params='cpu' fetches each stage-3 chunk"),
    ({"stage": 3, "offload_optimizer": "cpu", "offload_params": "disk"},
     "offload_params must be one of cpu, nvme or None, got 'disk'"),
    ({"stage": 3, "offload_params": "nvme"}, "it needs stage 3 and offload_optimizer 'cpu' or 'nvme'"),
    ({"stage": 3, "offload_optimizer": "cpu", "offload_params": "cpu", "offload_partition": "x"},
     "offload_partition must be one of bandwidth, owner, got 'x'"),
    ({"stage": 3, "offload_optimizer": "cpu", "offload_params": "nvme", "offload_buffer_elements": 100},
     "offload_buffer_elements=100 is smaller than the largest unit a rank reads from NVMe ('h.0': "
     "99136 elements): accepted an integer >= 99136"),
    ({"stage": 3, "offload_optimizer": "cpu", "offload_params": "nvme", "offload_buffer_elements": 99136,
      "offload_partition": "owner"}, "('h.0': 198272 elements): accepted an integer >= 198272"),
    ({"stage": 3, "offload_optimizer": "cpu", "offload_params": "cpu", "offload_buffer_elements": 900},
     "offload_buffer_elements=900 sizes the host buffer NVMe parameter reads land in: it needs "
     "offload_params='nvme'"),
    ({"stage": 3, "offload_optimizer": "cpu", "offload_params": "cpu", "offload_partition": "owner",
      "offload_prefetch": True}, "offload_prefetch=True prefetches offloaded parameters in the "
     "bandwidth layout: it needs offload_params 'cpu' or 'nvme' and offload_partition 'bandwidth'"),
    ({"stage": 3, "offload_optimizer": "cpu", "offload_partition": "owner"},
     "offload_partition='owner' says where offloaded parameters live"),
    ({"stage": 2, "offload_optimizer": "nvme", "nvme_path": "/no/such/dir"},
     "nvme_path '/no/such/dir' is not a directory"),
    ({"stage": 2, "offload_optimizer": "cpu", "nvme_path": "/tmp"}, "needs offload_optimizer='nvme' or offload_params='nvme'"),
    ({"stage": 2, "dpu": 2}, "dpu=2 delays ZeRO-Offload's host update: it needs offload_optimizer"),
    ({"stage": 2, "offload_optimizer": "cpu", "dpu": -1}, "dpu (warm-up steps"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_offload_setting_is_one_error_naming_it(kw, named):
    with pytest.raises(ValueError) as e:
        TrainConfig.of(n_d=2, **kw)
    assert named in str(e.value)


@pytest.mark.parametrize("argv, named", [
    (["--stage", "1", "--offload-optimizer", "cpu"], "stage=1"),
    (["--stage", "2", "--offload-optimizer", "nvme", "--nvme-path", "/no/such/dir"], "/no/such/dir"),
    (["--stage", "2", "--dpu", "1"], "dpu=1"),
])
def test_the_cli_refuses_them_in_one_line(capsys, argv, named):
    assert_usage_error(capsys, "train", "--steps", "1", *argv, named=named)


def test_dpu_with_loss_scaling_and_offloaded_parameters_runs_from_the_cli(capsys):
    """``--dpu`` beside ``--loss-scale``, ``--offload-params cpu`` and ``--offload-prefetch``
    trains (exit 0), and the parameters' tier moves bytes, not values: the exact losses and the
    master digest of the same command with the parameters on the device."""
    import json
    from tests.support.cli import run_cli
    base = ["train", "--format", "json", "--stage", "3", "--steps", "3", "--ranks", "4",
            "--model", "odd", "--offload-optimizer", "cpu", "--dpu", "2", "--loss-scale", "1024"]
    rc, out, err = run_cli(capsys, *base, "--offload-params", "cpu", "--offload-prefetch")
    rc2, ref, _ = run_cli(capsys, *base)
    assert rc == rc2 == 0 and err == "", err
    got, ref = json.loads(out), json.loads(ref)
    assert got["config"]["offload"]["offload_params"] == "cpu" and got["config"]["offload"]["dpu"] == 2
    assert len(got["losses"]) == 3 and got["losses"] == ref["losses"]
    assert got["master_sha256"] == ref["master_sha256"]


def test_a_dpu_run_refuses_a_checkpoint_it_could_not_resume_from():
    """A checkpoint at or after step N would miss the pending gradient: refused, naming both."""
    from zerospec.training.run import train
    from zerospec.model.gpt import ODD
    with pytest.raises(Exception, match=r"save=\[2\].*dpu=2"):
        train(TrainConfig(stage=2, n_d=2, model=ODD, steps=3,
                          offload=OffloadOptions(offload_optimizer="cpu", dpu=2)),
              save={2: "/tmp/never"})


def test_the_cli_flags_reach_the_run_and_its_table(capsys):
    """``--offload-optimizer cpu`` trains the same losses as the plain stage and adds the host
    link's bytes per step to the table: 4M in the paper's mode (ODD, N = 4: M = 1,640)."""
    from tests.support.cli import run_cli
    base = ["train", "--stage", "2", "--steps", "2", "--model", "odd"]
    rc, plain, _ = run_cli(capsys, *base)
    rc2, off, _ = run_cli(capsys, *base, "--offload-optimizer", "cpu")
    assert rc == rc2 == 0 and "optimizer offloaded to cpu (paper)" in off
    rows = [line.split(" | ") for line in off.splitlines() if line.startswith("| 2 ")]
    assert rows[0][-1].rstrip(" |") == "6,560"
    loss = [line.split(" | ")[1] for line in plain.splitlines() if line.startswith("| ")][1:]
    assert loss == [line.split(" | ")[1] for line in off.splitlines() if line.startswith("| ")][1:]
