"""A schedule hook for benchmarks: ``with barriers("backward"): train(cfg)``.

The simulator runs its ranks one at a time and hands the baton on at every collective a rank must
wait for, so such a collective inside backward (stage 3's re-gathers; stage 2's and 3's
reduce-scatters until they were posted, zerospec/comm/posted.py) makes all ranks run backward in
lockstep, unit by unit: every rank's activations stay alive while the others run, likely out of
cache when its turn comes. A real GPU holds its own activations
whatever the others do, so such a cost would belong to the simulation, not to ZeRO.

:func:`barriers` measures it on a stage with no collective in backward (stage 0): one barrier per
unit gradient, either at the moment the gradient is written (``"backward"``: the lockstep) or as
many right after backward (``"after_backward"``: the same hand-offs, no lockstep). Barriers move no
data and change no bit. Like zerospec/testing/faults.py, it patches one seam of
:class:`~zerospec.zero.fetch.ParamFetcher` for the duration of the block, in this process only
(the rank processes of ``train_processes`` are not reached); the library never imports this
module.
"""
from __future__ import annotations

import contextlib
from unittest import mock

import torch

from ..zero.fetch import ParamFetcher

WHERE = ("backward", "after_backward")


@contextlib.contextmanager
def barriers(where: str):
    """Inside the block, every rank of every threaded run issues one barrier per unit gradient,
    ``where`` (``"backward"`` or ``"after_backward"``). Yields a dict whose ``"issued"`` counts them."""
    if where not in WHERE:
        raise ValueError(f"barriers where must be one of {', '.join(WHERE)}, got {where!r}")
    seen = {"issued": 0}
    grad_written, check_complete = ParamFetcher.grad_written, ParamFetcher.check_complete

    def barrier(fetcher) -> None:
        fetcher.stage.comm.barrier()
        seen["issued"] += 1

    def in_backward(fetcher, i: int, grad16: torch.Tensor) -> None:
        grad_written(fetcher, i, grad16)
        barrier(fetcher)

    def after_backward(fetcher) -> None:
        check_complete(fetcher)
        for _ in fetcher.units:
            barrier(fetcher)

    patch = (mock.patch.object(ParamFetcher, "grad_written", in_backward) if where == "backward"
             else mock.patch.object(ParamFetcher, "check_complete", after_backward))
    with patch:
        yield seen
