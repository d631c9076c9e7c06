"""The decoder family on real processes: a tiny Llama on gloo trains as on the simulator."""
from __future__ import annotations

from tests.support.runs import assert_same_training
from tests.unit.model.test_family import LLAMA


def test_a_tiny_llama_on_gloo_processes_equals_the_simulator_in_stages_0_and_3():
    """N = 2 gloo processes, stages 0 and 3 (one launch): the simulator's losses and weights bit
    for bit, and each other's."""
    from zerospec.cluster.threads import VirtualCluster
    from zerospec.training.config import TrainConfig
    from zerospec.training.run import train, train_processes
    cfgs = [TrainConfig(stage=s, n_d=2, model=LLAMA, steps=3, timeout=60) for s in (0, 3)]
    real = train_processes(cfgs)
    for cfg, r in zip(cfgs, real):
        assert_same_training(train(cfg, cluster=VirtualCluster(2, torch_threads=1)), r)
    assert_same_training(real[0], real[1])
