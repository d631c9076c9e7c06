"""ZeRO-R's fused buffers (zerospec/zero_r/buffers.py): buckets change no sum, stay within B, free
what they take, and reject what they cannot do."""
from __future__ import annotations

import pytest

from tests.support.cli import assert_usage_error, run_cli
from tests.support.runs import assert_same_training, odd_run, stage_id
from zerospec.paper import theory
from zerospec.training.config import TrainConfig
from zerospec.training.sections import ZeroROptions

# Not a multiple of N = 4 (a bucket holds N·⌊B/N⌋ = 312 elements, and a stream of N rows needs 22
# buckets where one row needs 21) and smaller than the ODD model's large units (735, 2895 ×2),
# larger than its small one (30): every unit boundary falls inside a bucket. B = 37 (~180 buckets
# a stream) took 4× as long; one-column buckets (B = 4) run with the slow cases.
B = 313


@pytest.mark.parametrize("stage", range(4), ids=stage_id)
def test_buckets_change_no_sum_in_any_stage(stage):
    """Every gradient element is still reduced once, in rank order: bit-identical to per unit."""
    assert_same_training(odd_run(stage), odd_run(stage, bucket_elements=B))


@pytest.mark.slow
@pytest.mark.parametrize("stage", range(4), ids=stage_id)
@pytest.mark.parametrize("kw", [{"bucket_elements": "model"}, {"bucket_elements": 4},
                                {"zero1_comm": "all_reduce", "bucket_elements": B},
                                {"precision": "bf16", "bucket_elements": "model"},
                                {"precision": "fp32", "bucket_elements": B}],
                         ids=["fused_fp32", "one_column", "zero1_all_reduce", "bf16_fused", "fp32"])
def test_other_buffers_change_no_sum(stage, kw):
    """The naive fp32 buffer (one more rounding that changes nothing: the sum is fp32 already),
    one-column buckets, ZeRO-1's all-reduce variant, bf16 and fp32: bit-identical to per unit."""
    if "zero1_comm" in kw and stage != 1:
        pytest.skip("zero1_comm is stage 1's")
    base = {k: v for k, v in kw.items() if k != "bucket_elements"}
    assert_same_training(odd_run(stage, **base), odd_run(stage, **kw))


@pytest.mark.parametrize("stage", [pytest.param(0, marks=pytest.mark.slow), 2], ids=stage_id)
def test_exact_sums_stay_exact_through_fp64_buckets(stage):
    """G = 2 micro-batches: the bucket is fp64 and accumulates into the shard, as per unit."""
    assert_same_training(odd_run(stage, grad_accum_steps=2),
                         odd_run(stage, grad_accum_steps=2, bucket_elements=B))


@pytest.mark.parametrize("stage", range(4), ids=stage_id)
def test_one_bucket_of_at_most_b_elements_exists_at_a_time_and_is_freed(stage):
    """Peak of the bucket category = N·⌊B/N⌋ fp16 elements (B for stage 0's all-reduce); 0 after."""
    r = odd_run(stage, bucket_elements=B)
    rows = 1 if stage == 0 else 4
    for mem in r.memory:
        assert mem.peak["bucket"] == 2 * rows * (B // rows)
        assert mem.current["bucket"] == 0


@pytest.mark.parametrize("stage", range(4), ids=stage_id)
def test_buckets_issue_ceil_columns_over_width_collectives(stage):
    """Per step: ⌈T/⌊B/rows⌋⌉ bucketed collectives per stream; stage 3's per-use gathers unchanged."""
    on, off = odd_run(stage, bucket_elements=B), odd_run(stage)
    units, n = on.config.units(), 4
    ar = theory.bucket_collectives(sum(u.padded for u in units), B)
    rs = theory.bucket_collectives(sum(u.chunk for u in units), B, rows=n)
    want = {0: {"all_reduce": ar}, 1: {"reduce_scatter": rs, "all_gather": rs},
            2: {"reduce_scatter": rs, "all_gather": rs},
            3: {"reduce_scatter": rs, "all_gather": off.comm.count(0, step=1, op="all_gather")}}
    for op, count in want[stage].items():
        assert on.comm.count(0, step=1, op=op) == count
    assert on.comm.count(0, step=1) == sum(want[stage].values())


def test_the_wire_carries_the_same_elements_with_buckets():
    """Stage 2: the same elements and bytes per rank, bucketed or per unit."""
    on, off = odd_run(2, bucket_elements=B), odd_run(2)
    for r in range(4):
        assert on.comm.elements(r) == off.comm.elements(r)
        assert on.comm.bytes(r) == off.comm.bytes(r)


@pytest.mark.parametrize("value,stage,match", [
    (0, 0, "bucket_elements must be an integer >= 1"), (-5, 2, "got -5"),
    (True, 0, "got True"), (2.5, 0, "got 2.5"), ("models", 0, "got 'models'"),
    (3, 1, "bucket_elements=3 is smaller than n_d=4")])
def test_bad_bucket_sizes_are_rejected_naming_the_value(value, stage, match):
    """A bucket size < 1, not an integer, an unknown mode, or too small to give each rank an element."""
    with pytest.raises(ValueError, match=match):
        TrainConfig(stage=stage, n_d=4, zero_r=ZeroROptions(bucket_elements=value))


def test_stage_0_accepts_a_bucket_smaller_than_n_d():
    """An all-reduce bucket is one row: any B ≥ 1 works."""
    assert TrainConfig(stage=0, n_d=4, zero_r=ZeroROptions(bucket_elements=1)).bucket_elements == 1


def test_collective_counts_are_ceilings():
    """⌈columns / ⌊B/rows⌋⌉, and a bucket narrower than one column is refused."""
    assert theory.bucket_collectives(10, 5) == 2
    assert theory.bucket_collectives(11, 5) == 3
    assert theory.bucket_collectives(10, 9, rows=4) == 5
    with pytest.raises(ValueError, match="holds no column"):
        theory.bucket_collectives(10, 3, rows=4)


@pytest.mark.parametrize("argv,named", [(["--bucket-size", "0"], "'0'"),
                                        (["--bucket-size", "big"], "'big'"),
                                        (["--stage", "2", "--bucket-size", "2"], "bucket_elements=2")])
def test_the_cli_refuses_a_bad_bucket_size_by_name(capsys, argv, named):
    """`zerospec train --bucket-size`: exit 2, one line naming the value."""
    assert_usage_error(capsys, "train", *argv, named=named)


def test_the_cli_trains_through_buckets(capsys):
    """`--bucket-size 1000` reaches the run: step 1 moves the same elements in more collectives
    (and its loss, computed before any reduction, is the same)."""
    rows = {}
    for extra in ([], ["--bucket-size", "1000"]):
        rc, out, _ = run_cli(capsys, "train", "--stage", "2", "--steps", "1", *extra)
        assert rc == 0
        rows[bool(extra)] = [line.split(" | ") for line in out.splitlines() if line.startswith("| 1 ")]
    (off,), (on,) = rows[False], rows[True]
    assert on[1] == off[1] and on[3] == off[3] and int(on[2]) > int(off[2])


@pytest.mark.parametrize("stage", [0, pytest.param(1, marks=pytest.mark.slow), 2,
                                   pytest.param(3, marks=pytest.mark.slow)], ids=stage_id)
def test_the_observer_sees_no_byte_of_the_buckets_outside_the_ledger(stage):
    """With buckets, the memory observer (runtime/observe.py) still agrees with the ledger: at
    every phase entry byte for byte (+ the named extras), at every peak with nothing unnamed — so
    the bucket, and nothing beside it, is what bucketing allocates."""
    from tests.support.observed import named_extras, persistent_extras, observed
    r, obs = observed(stage, "odd", 2, bucket_elements=B)
    for rank, o in enumerate(obs):
        assert r.memory[rank].peak["bucket"] > 0
        for label, entry in o.entries.items():
            assert entry.bytes == entry.ledger_bytes + persistent_extras(r, label), entry.describe()
        for label, peak in o.peaks.items():
            named = named_extras(r, label, peak)
            assert peak.bytes == peak.ledger_bytes + sum(s.nbytes for g in named.values() for s in g)
            assert not named["UNNAMED"], peak.describe()
