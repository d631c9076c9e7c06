"""--offload-mode without --offload-optimizer: refused in every command, never dropped."""
from __future__ import annotations

import pytest

from tests.support.cli import assert_usage_error


@pytest.mark.parametrize("argv", [
    ("scale", "--preset", "1.5B", "--gpus", "8"),
    ("train", "--backend", "sim", "--stage", "2", "--ranks", "2", "--steps", "1"),
    ("plan", "--explain", "--preset", "t4-1.16B-24x1920", "--gpus", "8", "--stage", "2",
     "--seq", "16"),
])
def test_offload_mode_alone_is_refused(capsys, argv):
    """It names the flag it needs instead of measuring a run without offload."""
    assert_usage_error(capsys, *argv, "--offload-mode", "deepspeed",
                       named="--offload-mode deepspeed says which gradients ZeRO-Offload sends "
                             "down; it needs --offload-optimizer cpu or nvme")
