"""NCCL on real GPUs: the same stage code, and the ledger's bytes are the CUDA allocator's bytes."""
from __future__ import annotations

import pytest
import torch

from tests.engine import workers
from tests.runs import MODELS, run, stage_id
from zerospec.cluster.processes import launch
from zerospec.training.config import TrainConfig

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (NCCL)")]

BLOCK = 512   # the CUDA caching allocator rounds every allocation up to a multiple of 512 bytes


@pytest.fixture(scope="module")
def n_d() -> int:
    return min(2, torch.cuda.device_count())   # NCCL needs one device per rank


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3], ids=stage_id)
def test_nccl_ledger_model_states_are_what_cuda_allocated(n_d, stage, precision):
    """After setup, torch.cuda.memory_allocated grew by the ledger's buffers, each rounded to 512 B."""
    cfg = TrainConfig(stage=stage, n_d=n_d, model=MODELS["small"], steps=2, precision=precision,
                      timeout=120)
    sim = run(stage, n_d, "small", steps=2, precision=precision)
    for r, o in enumerate(launch(workers.gpu_memory, n_d, cfg, backend="nccl", timeout=120)):
        assert sum(o["storages"]) == o["ledger_model_states"] == o["ledger_total"]
        assert o["allocated"] == sum(-(-b // BLOCK) * BLOCK for b in o["storages"])
        # in training the ledger leaves out only the compute casts and kernels' workspaces
        assert o["ledger_peak"] <= o["allocated_peak"]
        # step 1 starts from the same weights: only GPU vs CPU fp32 kernels differ (sum order over
        # at most K = 4·128 terms: ≤ 512·u ≈ 3e-5 relative, far looser in practice)
        ref = float(sim.rank_losses[r][0])
        assert abs(o["losses"][0] - ref) <= 3e-5 * abs(ref)
