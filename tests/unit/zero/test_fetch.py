"""ParamFetcher: what a unit's gradient slot holds after backward, whatever each use touched."""
from __future__ import annotations

import types

import pytest
import torch

from zerospec.runtime.memory import MemoryLedger, storage_key
from zerospec.model.units import make_units
from zerospec.zero.fetch import ParamFetcher
from zerospec.zero.saved import UseState


class _Stage:
    """The fetcher's view of a stage: resident fp16 parameters, persistent (stale) gradient slots."""

    resident = True

    def __init__(self, dtype=torch.float16):
        self.units = make_units([("u", [("a", (3,)), ("b", (2,))])], n_d=1, pad=False)
        self.ctx = types.SimpleNamespace(memory=MemoryLedger())
        self.params = [torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=dtype)]
        self.slots = [torch.full((5,), 7.0, dtype=dtype)]   # last step's gradient
        self.ready: list[int] = []

    def is_resident(self, i):
        return self.resident

    def keep_for_backward(self, i):
        return False

    def acquire(self, i):
        return self.params[i]

    def release(self, i, full16):
        pass

    def end_backward(self):
        pass

    def grad_slot(self, i):
        return self.slots[i]

    def grad_ready(self, i, slot):
        self.ready.append(i)


def _run(forward, resident: bool = True, dtype=torch.float16) -> _Stage:
    stage = _Stage(dtype)
    stage.resident = resident
    stage.fetcher = fetcher = ParamFetcher(stage, torch.float32)
    with fetcher.hooks():
        loss = forward(fetcher.fetch)
    fetcher.end_forward()
    loss.backward()
    fetcher.check_complete()
    return stage


def _square(fetch):
    with fetch(0) as p:          # a * a saves a (twice) for backward
        return (p["a"] * p["a"]).sum() + p["b"].sum()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32-in-place"])
def test_gradients_of_every_use_of_a_unit_are_summed_into_its_slot_once(dtype):
    """A tied unit (used twice, like wte) gets d(use 1)+d(use 2), handed to the stage once; also
    where both uses read the stage's vector in place (fp32), one storage for both."""
    def forward(fetch):
        with fetch(0) as p:
            y = (p["a"] * torch.tensor([1.0, 1.0, 1.0])).sum() + (p["b"] * 3.0).sum()
        with fetch(0, last=True) as p:   # the second use touches only "a"
            y = y + (p["a"] * p["a"]).sum()
        return y
    stage = _run(forward, dtype=dtype)
    # d/da = 1 + 2a = 3, 5, 7; d/db = 3
    assert stage.slots[0].tolist() == [3.0, 5.0, 7.0, 3.0, 3.0] and stage.ready == [0]


def test_a_parameter_no_use_touches_gets_a_zero_gradient_not_last_steps():
    """A persistent slot is rewritten whole: an unused parameter's part is 0, not stale."""
    def forward(fetch):
        with fetch(0) as p:
            return (p["a"] * 2.0).sum()
    assert _run(forward).slots[0].tolist() == [2.0, 2.0, 2.0, 0.0, 0.0]


@pytest.mark.parametrize("resident", [True, False], ids=["stages0-2", "stage3"])
def test_no_fp32_compute_copy_outlives_backward(resident):
    """Stages 0–2 keep the forward's cast for backward, stage 3 casts again: both free it."""
    stage = _run(_square, resident)
    assert stage.slots[0].tolist() == [2.0, 4.0, 6.0, 1.0, 1.0]
    for use in stage.fetcher.saved.uses.values():
        assert use.leaf.untyped_storage().nbytes() == 0 and use.cast is None


def _nothing_saved(fetch):
    with fetch(0) as p:           # sums save nothing: the use ends with no saved view
        return p["b"].sum() + p["a"].sum()


@pytest.mark.parametrize("forward", [_square, _nothing_saved], ids=["views-saved", "none-saved"])
@pytest.mark.parametrize("resident", [True, False], ids=["stages0-2", "stage3"])
def test_fp32_training_reads_a_kept_unit_in_place_and_leaves_it_whole(forward, resident):
    """fp32 training: a unit the stage keeps is computed from the stage's own vector (no copy per
    use); one it does not keep (stage 3) from a copy. Either way the vector survives backward."""
    stage = _run(forward, resident, torch.float32)
    (use,) = stage.fetcher.saved.uses.values()
    in_place = storage_key(use.leaf) == storage_key(stage.params[0])   # (no repr of a freed leaf)
    assert in_place is resident
    assert stage.params[0].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert stage.slots[0].tolist() == ([2.0, 4.0, 6.0, 1.0, 1.0] if forward is _square
                                       else [1.0] * 5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("resident", [True, False], ids=["stages0-2", "stage3"])
def test_a_parameter_written_in_place_after_it_was_saved_is_refused(resident, dtype):
    """As autograd refuses it for saved tensors: backward would otherwise differ between stages."""
    def forward(fetch):
        with fetch(0) as p:
            y = (p["a"] * p["a"]).sum()
            with torch.no_grad():
                p["a"].mul_(10)
        return y
    with pytest.raises(RuntimeError, match="unit 'u' was modified in place after autograd saved it"):
        _run(forward, resident, dtype)


def test_a_unit_fetched_inside_its_own_fetch_block_is_refused():
    """Read in place, both uses would share one storage: a view saved in the outer block would be
    charged to the inner use, released first (SavedTensors.add_use)."""
    def forward(fetch):
        with fetch(0) as p, fetch(0) as q:
            return (p["a"] * q["a"]).sum()
    with pytest.raises(RuntimeError, match="unit 'u' fetched again inside its own fetch block"):
        _run(forward, True, torch.float32)


@pytest.mark.parametrize("resident,last,after_forward", [
    (True, False, UseState.CAST_KEPT), (True, True, UseState.CAST_KEPT),
    (False, False, UseState.SAVED), (False, True, UseState.UNIT_KEPT),
], ids=["stages0-2", "stages0-2-last", "stage3", "stage3-last"])
def test_a_use_with_saved_views_goes_from_forward_through_its_kept_state_to_released(resident, last,
                                                                                     after_forward):
    """A use's state: FORWARD in the block; then what backward will read; RELEASED after backward."""
    states = []

    def forward(fetch):
        with fetch(0, last=last) as p:
            (use,) = fetch.__self__.saved.uses.values()     # fetch is the fetcher's bound method
            states.append(use.state)
            y = (p["a"] * p["a"]).sum()
        states.append(use.state)
        return y
    (use,) = _run(forward, resident).fetcher.saved.uses.values()
    assert states == [UseState.FORWARD, after_forward] and use.state is UseState.RELEASED
    assert use.full16 is None and use.cast is None


def test_a_use_nothing_was_saved_from_is_released_when_its_block_ends():
    """No saved view (b.sum() saves nothing): the use is RELEASED as the fetch block ends."""
    def forward(fetch):
        with fetch(0) as p:
            return p["b"].sum() + p["a"].sum()
    (use,) = _run(forward).fetcher.saved.uses.values()
    assert use.refs == 0 and use.state is UseState.RELEASED


@pytest.mark.parametrize("resident", [True, False], ids=["stages0-2", "stage3"])
def test_a_second_backward_over_one_graph_is_refused_not_read_from_freed_memory(resident):
    """retain_graph=True: the saved parameter views were freed by the first backward."""
    stage = _Stage()
    stage.resident = resident
    fetcher = ParamFetcher(stage, torch.float32)
    with fetcher.hooks():
        loss = _square(fetcher.fetch)
    fetcher.end_forward()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="unit 'u'.s parameters saved for backward was already freed"):
        loss.backward()


def test_a_second_backward_over_a_saved_activation_is_refused():
    """The same for an activation: counted once, freed at its last unpack, not unpacked again."""
    stage = _Stage()
    fetcher = ParamFetcher(stage, torch.float32)
    with fetcher.hooks():
        with fetcher.fetch(0) as p:
            h = p["a"] * 3.0                  # an activation (mul by a scalar saves nothing)
            loss = (h * h).sum()              # saves h twice
    fetcher.end_forward()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="an activation saved for backward was already freed"):
        loss.backward()


def test_views_of_one_activation_storage_are_counted_once_at_the_storage_s_size():
    """Two views of one 8-element storage, each saved twice: 32 bytes while saved, 0 after."""
    seen = []

    def forward(fetch):
        with fetch(0) as p:
            big = torch.cat([p["a"], p["b"], p["a"]])      # one new storage of 8 fp32
            y = (big[:4] * big[:4]).sum() + (big[4:] * big[4:]).sum()
        seen.append(fetch.__self__.saved.memory.current["activations"])
        return y
    stage = _run(forward)
    memory = stage.ctx.memory
    assert seen == [32] and memory.peak["activations"] == 32 and memory.current["activations"] == 0


def test_an_activation_backward_never_reads_is_freed_after_backward():
    """A branch the loss does not use saved an activation: released after backward, not kept."""
    def forward(fetch):
        with fetch(0) as p:
            h = p["a"] * 3.0
            (h * h).sum()                     # saves h; its node is never run by backward
            return p["a"].sum() + p["b"].sum()
    memory = _run(forward).ctx.memory
    assert memory.peak["activations"] == 12 and memory.current["activations"] == 0
