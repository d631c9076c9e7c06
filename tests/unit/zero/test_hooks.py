"""Features reach the stage only through its named hooks (zerospec/zero/hooks.py)."""
from __future__ import annotations

import pytest

from zerospec.offload.optimizer import HostOptimizer
from zerospec.offload.params import HostParams
from zerospec.offload.prefetch import Prefetching
from zerospec.zero import DataParallel, Parameters
from zerospec.zero.stage3_deepspeed import DeepSpeedParameters
from zerospec.zero.exact import FullAccumulation, ShardedAccumulation, _Exact
from zerospec.zero.fsdp2 import FSDP2Parameters
from zerospec.zero.fsdp2_offload import CPUOffloaded
from zerospec.zero.hooks import HOOKS
from zerospec.zero.hpz import SecondaryPartition
from zerospec.zero.mics import ReplicatedShards
from zerospec.zero.zeropp import Quantized

FEATURES = (_Exact, FullAccumulation, ShardedAccumulation, DeepSpeedParameters, Quantized,
            SecondaryPartition, HostOptimizer, HostParams, Prefetching, ReplicatedShards,
            FSDP2Parameters, CPUOffloaded)


@pytest.mark.parametrize("feature", FEATURES, ids=lambda c: c.__name__)
def test_a_feature_overrides_only_named_hooks(feature):
    """Every method or attribute a feature defines that the stages (or another feature) also
    define is one of StageHooks': no feature overrides another's private method."""
    shared = set(dir(Parameters)) | set(dir(DataParallel))
    for other in FEATURES:
        if other is not feature:
            shared |= set(vars(other))
    overrides = {n for n in vars(feature) if n in shared and not n.startswith("__")}
    assert overrides <= HOOKS, sorted(overrides - HOOKS)
