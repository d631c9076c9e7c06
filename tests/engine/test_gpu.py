"""NCCL on real GPUs: the same stage code, and the ledger's bytes are the CUDA allocator's bytes."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.engine import workers
from tests.support.runs import MODELS, run, stage_id
from zerospec.cluster.processes import launch
from zerospec.cluster.threads import VirtualCluster
from zerospec.runtime.memory import TraceEvent
from zerospec.runtime.trace import replay
from zerospec.training.config import TrainConfig
from zerospec.training.sections import OptimOptions
from zerospec.training.run import train

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
    cfg = TrainConfig(stage=stage, n_d=n_d, model=MODELS["small"], steps=2, timeout=120,
                      optim=OptimOptions(precision=precision))
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


# -- the caching allocator model (zerospec/runtime/allocator.py) against the real one -------------
# each trace is replayed in a fresh process: a clean allocator, configured by its environment
REPLAY_ON_CUDA = """
import json, sys, torch
live, out, streams = {}, [], {"default": torch.cuda.current_stream()}
for op, key, nbytes, label, stream in json.load(open(sys.argv[1])):
    if op == "alloc":
        s = streams.setdefault(stream, torch.cuda.Stream())
        with torch.cuda.stream(s):
            live[key] = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    elif op == "free":
        del live[key]
    else:
        out.append([label, torch.cuda.memory_allocated(), torch.cuda.memory_reserved()])
print(json.dumps(out))
"""
ALLOC_CONFS = {"default": ("", {}),
               "max_split_64": ("max_split_size_mb:64", {"max_split_size": 64 << 20}),
               "expandable": ("expandable_segments:True", {"expandable_segments": True})}


@functools.cache
def tiny_run_trace() -> list[TraceEvent]:
    """Rank 0's ledger trace of stage 3 on 2 virtual GPUs (CPU), 2 steps."""
    cluster = VirtualCluster(2)
    for ledger in cluster.memory:
        ledger.record_trace()
    return train(TrainConfig(stage=3, n_d=2, model=MODELS["small"], steps=2),
                 cluster=cluster).memory[0].trace


def fragmenting_trace() -> list[TraceEvent]:
    """tests/unit/runtime/test_allocator.py's fragmenting case, large-pool sizes, a marker per step."""
    MiB = 1 << 20
    ev = [TraceEvent("alloc", 1, 100 * MiB), TraceEvent("alloc", 2, 100 * MiB + 7),
          TraceEvent("phase", label="made")]
    ev += [TraceEvent("free", 1, 100 * MiB), TraceEvent("free", 2, 100 * MiB + 7),
           TraceEvent("phase", label="freed")]
    ev += [TraceEvent("alloc", 3, 60 * MiB), TraceEvent("alloc", 4, 60 * MiB + 3),
           TraceEvent("alloc", 5, 5 * MiB), TraceEvent("alloc", 6, 1000),
           TraceEvent("phase", label="refilled")]
    return ev + [TraceEvent("free", 4, 60 * MiB + 3), TraceEvent("alloc", 7, 50 * MiB),
                 TraceEvent("phase", label="end")]


def two_streams_trace() -> list[TraceEvent]:
    """tests/unit/runtime/test_allocator_streams.py's case: a block freed on the default stream,
    the same size on a side stream (a new segment), then the default stream again (a reuse)."""
    MiB = 1 << 20
    return [TraceEvent("alloc", 1, 100 * MiB), TraceEvent("free", 1, 100 * MiB),
            TraceEvent("phase", label="freed"),
            TraceEvent("alloc", 2, 100 * MiB, stream="all_gather"),
            TraceEvent("phase", label="side stream"),
            TraceEvent("alloc", 3, 30 * MiB), TraceEvent("alloc", 4, 30 * MiB, stream="all_gather"),
            TraceEvent("phase", label="end")]


# the function's skipif is evaluated before the module's: this reason names the device check
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs CUDA: the allocator model's device check, run on a GPU machine "
                           "`pytest -m gpu tests/engine/test_gpu.py -k allocator_model` (compares "
                           "reserved bytes per phase with torch.cuda; spec/allocator.md)")
@pytest.mark.parametrize("conf", list(ALLOC_CONFS))
@pytest.mark.parametrize("make_trace", [tiny_run_trace, fragmenting_trace, two_streams_trace],
                         ids=["tiny_run", "fragmenting", "two_streams"])
def test_allocator_model_reserves_what_cuda_reserves_at_every_phase(conf, make_trace, tmp_path):
    """Replayed with torch.empty on CUDA, memory_allocated/memory_reserved at each phase marker
    equal the model's allocated/reserved bytes (same PYTORCH_CUDA_ALLOC_CONF; each allocation on
    its event's stream, a side stream a torch.cuda.Stream of its own)."""
    env_conf, options = ALLOC_CONFS[conf]
    trace = make_trace()
    path = tmp_path / "trace.json"
    path.write_text(json.dumps([[e.op, e.key, e.nbytes, e.label, e.stream] for e in trace]))
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=env_conf)
    done = subprocess.run([sys.executable, "-c", REPLAY_ON_CUDA, str(path)], env=env,
                          capture_output=True, text=True, timeout=300, check=True)
    real = [tuple(x) for x in json.loads(done.stdout)]
    model = [(p.label, p.allocated, p.reserved) for p in replay(trace, **options).phases]
    assert model == real
