"""``--qwz``, ``--qgz`` and ``--quant-group-size`` on ``zerospec train`` and ``zerospec scale``
(spec/zeropp.md)."""
from __future__ import annotations

import pytest

from tests.support.cli import assert_usage_error, run_cli

TRAIN = ["train", "--stage", "3", "--ranks", "4", "--gpus-per-node", "2", "--steps", "1"]
SCALE = ["scale", "--layers", "2", "--hidden", "64", "--gpus", "8", "--gpus-per-node", "4"]


def test_quantized_collectives_with_fp32_parameters_exit_2_naming_them(capsys):
    """qwZ on fp32 parameters: exit 2, one line naming the precision and the accepted ones."""
    assert_usage_error(capsys, *TRAIN, "--qwz", "--precision", "fp32",
                       named="got precision='fp32' (fp32 parameters); accepted: 'fp16', 'bf16'")


@pytest.mark.slow
def test_scale_reports_stage3s_bytes_across_with_the_quantized_collectives(capsys):
    """zerospec scale --qwz --qgz: stage 3's line adds the bytes leaving node 0."""
    code, out, _ = run_cli(capsys, *SCALE, "--qwz", "--qgz", "--stages", "3")
    assert code == 0 and "Ψ in fp16 elements (bytes / 2)" in out


def test_a_group_size_no_shard_can_hold_exits_2_naming_it(capsys):
    """--quant-group-size larger than a unit's shard: exit 2, one line naming it and 1..shard."""
    assert_usage_error(capsys, *TRAIN, "--model", "odd", "--qgz", "--quant-group-size", "400",
                       named="quantization group size 400 cannot be used on the shard of unit "
                             "'embed' of 184 elements")


def test_train_reports_the_bytes_leaving_node_0(capsys):
    """With qwZ and qgZ the table adds node 0's cross-node bytes: below stage 3's (2 B an
    element, since fp16 crosses otherwise)."""
    code, out, _ = run_cli(capsys, *TRAIN, "--model", "odd", "--qwz", "--qgz")
    assert code == 0 and "bytes leaving node 0" in out and "qwZ, qgZ" in out
    last = out.strip().splitlines()[-1].split("|")
    elements, nbytes = (int(c.replace(",", "")) for c in last[-3:-1])
    code, out, _ = run_cli(capsys, *TRAIN, "--model", "odd")
    plain = int(out.strip().splitlines()[-1].split("|")[-2].replace(",", ""))
    assert 0 < nbytes < 2 * plain
