"""zerospec/model/gpt.py's ``loss``: the logits upcast to fp32 before the cross-entropy, as
torchtitan, Hugging Face and Megatron-LM compute it — observed on meta in the step's storage trace,
and bit-neutral on the CPU, where the logits are fp32 already."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from zerospec.model import gpt
from zerospec.model.gpt import GPTConfig
from zerospec.training.config import TrainConfig
from zerospec.training.scale import measure

# a vocabulary no other tensor's size shares: b·s·V elements are the loss's alone
M = GPTConfig(vocab_size=97, block_size=8, n_layer=1, n_head=2, n_embd=24)
B, T = 2, 8


def allocations_of(nbytes: int, precision: str = "fp16") -> list[str]:
    """The phase of every storage of ``nbytes`` bytes one meta step allocates (its trace)."""
    r = measure(TrainConfig.of(stage=0, n_d=1, model=M, precision=precision), micro_batch=B,
                trace=True)
    out, events = [], r.classes[0].allocations
    for i, e in enumerate(events):
        if e.op == "alloc" and e.nbytes == nbytes:
            out.append(next(x.label for x in events[i:] if x.op == "phase").split("@")[0])
    return out


def test_in_fp16_the_loss_holds_fp32_tensors_of_the_logits_size():
    """Forward: the fp32 copy and log-softmax's fp32 output; backward: nll_loss's fp32 gradient
    and ``_log_softmax_backward_data``'s. In fp16 only the logits and their gradient."""
    n = B * T * M.vocab_size
    assert allocations_of(4 * n) == ["forward", "forward", "backward", "backward"]
    assert allocations_of(2 * n) == ["forward", "backward"]


def test_on_the_cpu_the_upcast_moves_no_bit():
    """fp32 logits: ``.float()`` returns the same tensor, so the loss and its gradient are
    F.cross_entropy's on the logits as they are, torch.equal."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B * T, M.vocab_size, generator=g, requires_grad=True)
    targets = torch.randint(M.vocab_size, (B * T,), generator=g)
    ours = gpt.loss(logits, targets)
    (mine,) = torch.autograd.grad(ours, logits)
    plain = F.cross_entropy(logits, targets)
    (theirs,) = torch.autograd.grad(plain, logits)
    assert torch.equal(ours, plain) and torch.equal(mine, theirs)
