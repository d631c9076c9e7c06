"""train()'s host side (initial weights, batches, the result's masters) computes on the cluster's
torch thread count, as its ranks do (zerospec/training/run.py)."""
from __future__ import annotations

import torch

from zerospec.cluster.threads import VirtualCluster, torch_threads
from zerospec.model.gpt import ODD
from zerospec.training import run as run_module
from zerospec.training.config import TrainConfig


def test_the_host_side_of_a_run_computes_on_the_ranks_thread_count(monkeypatch):
    """Initial weights, batches and the result are made on the cluster's one thread; the caller's count comes back."""
    seen = {}
    for name in ("initial_weights", "make_batches", "build_result"):
        real = getattr(run_module, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            seen[_name] = torch.get_num_threads()
            return _real(*args, **kwargs)
        monkeypatch.setattr(run_module, name, spy)
    with torch_threads(2):
        run_module.train(TrainConfig(stage=0, n_d=1, model=ODD, steps=1),
                         cluster=VirtualCluster(1, torch_threads=1))
        assert torch.get_num_threads() == 2
    assert seen == {"initial_weights": 1, "make_batches": 1, "build_result": 1}
