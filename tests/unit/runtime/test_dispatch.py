"""zerospec's dispatch modes run their ``__torch_dispatch__`` as written (zerospec/runtime/dispatch.py)."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from zerospec.runtime.observe import Observer
from zerospec.runtime.opcount import OpCounter
from zerospec.runtime.trace import StorageTrace
from zerospec.runtime.metacache import MetaKernelCache


class _Plain(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", [Observer, StorageTrace, OpCounter, MetaKernelCache],
                         ids=lambda m: m.__name__)
def test_no_mode_of_zerospec_has_torch_wrap_its_dispatch(mode):
    """torch wraps a plain mode's dispatch to keep torch.compile out of it (the wrapper imports
    torch._dynamo at the first op, 1.3–1.7 s); nothing here is compiled, so zerospec's modes opt out."""
    if not hasattr(_Plain.__torch_dispatch__, "__wrapped__"):
        pytest.skip(f"torch {torch.__version__} does not wrap dispatch modes")
    assert not hasattr(mode.__torch_dispatch__, "__wrapped__")
