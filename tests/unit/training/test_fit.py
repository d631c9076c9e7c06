"""zerospec/training/fit.py: memory-fit searches over measured (meta) steps."""
from __future__ import annotations

from zerospec.model.gpt import ODD
from zerospec.training.fit import max_micro_batch
from zerospec.training.scale import measure
from zerospec.training.config import TrainConfig


def _peak(r) -> int:
    return max(c.memory.peak_total for c in r.classes)


def test_the_batch_search_hands_back_the_steps_it_measured():
    """The answer is the most sequences whose measured peak fits; ``seen`` holds the steps the
    search measured, by batch: the answer's, which fits, and the one above, which does not."""
    seen: dict = {}
    b = max_micro_batch(ODD, 2, 4, 100_000, seen=seen)
    assert b == 3 and _peak(seen[b]) <= 100_000 < _peak(seen[b + 1])
    assert _peak(seen[b]) == _peak(measure(TrainConfig(stage=2, n_d=4, model=ODD), micro_batch=b))
