"""The base of zerospec's dispatch modes (the storage observer, the op counter, the meta kernel cache).

torch wraps every ``TorchDispatchMode`` subclass's ``__torch_dispatch__`` in
``torch._disable_dynamo`` (torch/utils/_python_dispatch.py, ``__init_subclass__``). The wrapper
imports ``torch._dynamo`` the first time an op runs under the mode (1.3–1.7 s, once per process)
and adds two Python calls to every op. Nothing in zerospec runs under ``torch.compile``, so there
is nothing for it to turn off: the class answers torch's ``_should_skip_dynamo`` with False, as
torch's docstring for that method shows, and the modes dispatch directly.
"""
from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class DispatchMode(TorchDispatchMode):
    """A ``TorchDispatchMode`` whose ``__torch_dispatch__`` torch does not wrap (module doc)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False
