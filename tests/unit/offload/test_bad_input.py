"""Item 7's bad input on `zerospec train`, one line and exit 2 each: offload without the stage it
needs, an NVMe path that is a file, not a directory (plan's DeepSpeed-config cases:
tests/unit/plan/test_ds_offload.py; tiles: ZeRO-Infinity's tests)."""
from __future__ import annotations

from tests.support.cli import assert_usage_error


def test_an_nvme_path_that_is_a_file_is_refused_naming_it(capsys, tmp_path):
    f = tmp_path / "swap.bin"
    f.write_bytes(b"")
    assert_usage_error(capsys, "train", "--steps", "1", "--stage", "2", "--offload-optimizer",
                       "nvme", "--nvme-path", str(f), named=f"{str(f)!r} is not a directory")


def test_parameter_offload_below_stage_3_is_refused_naming_the_stage(capsys):
    assert_usage_error(capsys, "train", "--steps", "1", "--stage", "2", "--offload-optimizer",
                       "cpu", "--offload-params", "cpu", named="got stage=2")


def test_an_nvme_path_without_the_nvme_tier_is_refused(capsys, tmp_path):
    assert_usage_error(capsys, "train", "--steps", "1", "--stage", "2", "--nvme-path",
                       str(tmp_path), named="is the NVMe tier's directory")
