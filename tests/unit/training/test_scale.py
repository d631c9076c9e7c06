"""zerospec.training.scale: a few representative ranks on meta tensors stand exactly for all N.

The central check is ``test_representative_ranks_give_the_ledgers_of_all_ranks_as_threads``: the
same step run for every one of 48 ranks through the ordinary VirtualCluster (thread rendezvous)
gives, rank by rank, the same comm records and memory snapshots as the few representative ranks
run alone against the meta backend.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from zerospec.training import scale as scale_mod
from zerospec.comm.interconnect import Call
from zerospec.comm.meta import MetaBackend
from zerospec.runtime.errors import CollectiveError, RankError
from zerospec.model.gpt import GPTConfig
from zerospec.model.units import make_units
from zerospec.model.presets import PAPER, PRESETS, preset
from zerospec.training.scale import measure, rank_classes
from zerospec.training.sections import BatchOptions
from zerospec.training.config import TrainConfig
from zerospec.training.run import train

ODD = GPTConfig(vocab_size=37, block_size=12, n_layer=2, n_head=3, n_embd=15)  # units 735, 2895 ×2, 30
# units 39, 147, 6: five kinds of rank class at N = 12 (the representative-rank test below)
ONE_LAYER = GPTConfig(vocab_size=5, block_size=8, n_layer=1, n_head=1, n_embd=3)


# -- rank classes -----------------------------------------------------------------------------------
def test_rank_classes_cut_where_some_unit_turns_to_padding():
    """Units of 735, 2895 and 30 elements on 64 ranks: chunks of 12, 46 and 1 elements.

    embed: ranks 0..60 real, 61 holds 3 real + 9 padding, 62.. padding only;
    blocks: 0..61 real, 62 holds 43 real, 63 padding only; ln_f: 0..29 real, 30.. padding only.
    """
    units = ODD.units(64)
    assert [(c.start, c.stop) for c in rank_classes(units, 64)] == [
        (0, 30), (30, 61), (61, 62), (62, 63), (63, 64)]


def test_a_stage_that_partitions_nothing_has_one_class():
    assert rank_classes(ODD.units(64, pad=False), 64, partitioned=False) == [range(64)]


def test_paper_presets_need_no_padding_on_table1_gpu_counts():
    """d is a multiple of 1024 for 7.5B, 128B, 1T: every unit divides N_d ≤ 1024, one class."""
    for name in ("7.5B", "128B", "1T"):
        units = preset(name).model.units(1024)
        assert rank_classes(units, 1024) == [range(1024)], name


@settings(max_examples=60, deadline=None)
@given(numels=st.lists(st.integers(1, 5000), min_size=1, max_size=5), n_d=st.integers(1, 300))
def test_ranks_in_a_class_own_the_same_real_elements_and_neighbours_differ(numels, n_d):
    units = make_units([(f"u{i}", [("w", (k,))]) for i, k in enumerate(numels)], n_d)
    classes = rank_classes(units, n_d)
    assert [r for c in classes for r in c] == list(range(n_d))
    sig = [tuple(u.real_in_shard(r) for u in units) for r in range(n_d)]
    for c in classes:
        assert {sig[r] for r in c} == {sig[c.start]}
    for a, b in zip(classes, classes[1:]):
        assert sig[a.start] != sig[b.start]


# -- exactness against the thread cluster ------------------------------------------------------------
def _assert_same_ledgers(full, scaled, n_d):
    comm = scaled.comm_ledger()
    for r in range(n_d):
        assert full.comm.records(r) == comm.records(r), f"rank {r}: comm records differ"
        mine, theirs = scaled.memory(r), full.memory[r]
        assert mine.snapshots == theirs.snapshots, f"rank {r}: memory snapshots differ"
        assert (mine.peak, mine.peak_total) == (theirs.peak, theirs.peak_total), f"rank {r}: peaks"
        assert scaled.model_states(r) == full.model_states(r)
        assert scaled.rank_class(r).output.optim_elements == full.ranks[r].optim_elements


@pytest.mark.parametrize("stage", [
    0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow), 3])
def test_representative_ranks_give_the_ledgers_of_all_ranks_as_threads(stage):
    """12 ranks, a 1-layer model whose units pad unevenly: in stages 1–3 five rank classes — ranks
    0–5 all real, 6–8 ln_f padding only, 9 the embedding part padding, 10 the embedding padding
    only, 11 h.0 part padding; stage 0 all-reduces units that 12 does not divide, so ranks send
    different amounts. (16 ranks add an h.0 shard of padding only, and 48 ranks of a wider layer
    gave these five at four times the threads; the stage code treats every unit alike.)"""
    n_d = 12
    full = train(TrainConfig(stage=stage, n_d=n_d, model=ONE_LAYER, steps=1, device="meta",
                             batching=BatchOptions(global_batch=n_d)))
    scaled = measure(TrainConfig(stage=stage, n_d=n_d, model=ONE_LAYER))
    assert [(c.ranks.start, c.ranks.stop) for c in scaled.classes] == (
        [(0, 12)] if stage == 0 else [(0, 6), (6, 9), (9, 10), (10, 11), (11, 12)])
    _assert_same_ledgers(full, scaled, n_d)
    if stage == 0:
        assert len({full.comm.elements(r) for r in range(n_d)}) > 1   # the case is not trivial


def test_representative_ranks_give_every_ranks_links_and_hpz_shards_as_threads():
    """3 nodes × 4 GPUs, hpZ h = 2: each rank's records (their link class from its own ring
    successor, hpZ's in-node gathers) and memory, rebuilt from the representatives, equal the
    12 threads'."""
    n_d, kw = 12, {"gpus_per_node": 4, "hpz": 2}
    full = train(TrainConfig.of(stage=3, n_d=n_d, model=ONE_LAYER, steps=1, global_batch=n_d,
                                device="meta", **kw))
    scaled = measure(TrainConfig.of(stage=3, n_d=n_d, model=ONE_LAYER, **kw))
    _assert_same_ledgers(full, scaled, n_d)
    assert {r: full.comm.elements(r, link="inter") > 0 for r in range(n_d)} == {
        r: r % 4 == 3 for r in range(n_d)}          # each node's last GPU sends across


def test_representative_ranks_give_every_ranks_mics_groups_as_threads():
    """3 nodes × 4 GPUs, MiCS with a partition group per node (p = 4): the representatives of
    the first group, booked on each rank's own partition and replication rings, give the 12
    threads' records (their links included) and memory."""
    n_d, kw = 12, {"gpus_per_node": 4, "shard_group": 4}
    full = train(TrainConfig.of(stage=3, n_d=n_d, model=ONE_LAYER, steps=1, global_batch=n_d,
                                device="meta", **kw))
    scaled = measure(TrainConfig.of(stage=3, n_d=n_d, model=ONE_LAYER, **kw))
    _assert_same_ledgers(full, scaled, n_d)
    assert {r: full.comm.elements(r, link="inter") == full.comm.elements(r, group="replica") > 0
            for r in range(n_d)} == {r: True for r in range(n_d)}   # only replicas cross


def test_representative_ranks_give_every_ranks_quantized_all_to_alls_as_threads():
    """3 nodes × 4 GPUs with hpZ, qwZ and qgZ: each rank's int8 gathers and int4 all-to-alls
    (qgZ's node and one-GPU-per-node groups, booked on their link classes) and its memory,
    rebuilt from the representatives, equal the 12 threads'; every GPU sends across."""
    n_d, kw = 12, {"gpus_per_node": 4, "hpz": 2, "qwz": True, "qgz": True}
    full = train(TrainConfig.of(stage=3, n_d=n_d, model=ONE_LAYER, steps=1, global_batch=n_d,
                                device="meta", **kw))
    scaled = measure(TrainConfig.of(stage=3, n_d=n_d, model=ONE_LAYER, **kw))
    _assert_same_ledgers(full, scaled, n_d)
    assert all(full.comm.bytes(r, op="all_to_all", link="inter") > 0 for r in range(n_d))


def test_the_kernel_cache_changes_no_ledger():
    cfg = TrainConfig(stage=3, n_d=8, model=ODD)
    cached, plain = measure(cfg), measure(cfg, cache_kernels=False)
    for a, b in zip(cached.classes, plain.classes):
        assert a.ranks == b.ranks and a.trace == b.trace
        assert a.memory.snapshots == b.memory.snapshots and a.memory.peak == b.memory.peak


def _events(allocations) -> list[tuple]:
    """A storage trace with each storage key (an address, reused once freed) replaced by the
    number of its alloc event."""
    live, out, births = {}, [], 0
    for e in allocations:
        if e.op == "alloc":
            live[e.key], births = births, births + 1
        n = live.pop(e.key) if e.op == "free" else live.get(e.key) if e.op == "alloc" else None
        out.append((e.op, n, e.nbytes, e.category, e.label))
    return out


def test_a_step_answered_from_earlier_steps_kernels_equals_one_from_an_empty_table():
    """The process's shared table of meta kernels: a step measured after steps of other
    precisions, stages and shapes (the same shapes in fp32 first) has the ledgers, collectives
    and storage trace of the same step measured from an empty table."""
    from zerospec.runtime import metacache
    cfg = TrainConfig(stage=3, n_d=8, model=ODD)
    metacache.forget()
    cold = measure(cfg, trace=True)
    metacache.forget()
    measure(cfg.replace(precision="fp32"), trace=True)
    for stage in range(3):                   # other stages, another micro-batch: other keys
        measure(cfg.replace(stage=stage), micro_batch=2, trace=True)
    warm = measure(cfg, trace=True)
    for a, b in zip(cold.classes, warm.classes, strict=True):
        assert a.ranks == b.ranks and a.trace == b.trace
        assert a.memory.snapshots == b.memory.snapshots and a.memory.peak == b.memory.peak
        assert _events(a.allocations) == _events(b.allocations)


def test_a_traced_step_answered_from_the_kernel_table_has_the_trace_of_one_that_runs_every_kernel():
    """The trace runs each op through the kernel cache itself (one dispatch mode) and skips its
    look at the inputs of an op answered from the table: a stage's storage trace and ledger
    trace, event for event, as with every kernel run (stage 3: resizes, gathers, frees)."""
    for stage in (1, 3):
        cfg = TrainConfig(stage=stage, n_d=8, model=ODD)
        measure(cfg, trace=True)             # the table holds every key of the step after this
        warm, plain = measure(cfg, trace=True), measure(cfg, trace=True, cache_kernels=False)
        for a, b in zip(warm.classes, plain.classes, strict=True):
            assert _events(a.allocations) == _events(b.allocations)
            assert _events(a.memory.trace) == _events(b.memory.trace)


def test_one_rank_class_stepped_alone_is_that_class_of_the_whole_step():
    """measure(only=i) steps the i-th rank class alone, as the whole step steps it, and says
    how many the step has; a rank of a class it did not step is refused with its reason."""
    cfg = TrainConfig(stage=3, n_d=8, model=ODD)
    whole = measure(cfg, trace=True)
    assert whole.complete and whole.class_count == len(whole.classes) > 1
    for i, c in enumerate(whole.classes):
        one = measure(cfg, trace=True, only=i)
        assert (len(one.classes), one.class_count, one.complete) == (1, whole.class_count, False)
        assert one.classes[0].ranks == c.ranks and one.classes[0].trace == c.trace
        assert one.classes[0].memory.snapshots == c.memory.snapshots
        assert _events(one.classes[0].allocations) == _events(c.allocations)
    with pytest.raises(ValueError, match=r"rank 0's class was not stepped: this result holds 1 "
                                         r"of the step's \d rank classes"):
        one.model_states(0)
    with pytest.raises(ValueError, match=r"only .* must be in 0\.\.\d: .* got 9"):
        measure(cfg, only=9)


def test_count_in_counts_one_rank_classs_ops_and_steps_every_class_as_the_counted_step():
    """measure(count_in=i) with count_flops: the i-th rank class's ops and FLOPs are those of
    the step counted in every class, no other class's are counted, and every class's ledgers
    and collectives are the counted step's."""
    cfg = TrainConfig(stage=3, n_d=8, model=ODD, count_flops=True)
    whole, one = measure(cfg), measure(cfg, count_in=1)
    plain = measure(cfg.replace(count_flops=False)).classes[0].output
    assert len(whole.classes) >= 2 and whole.classes[1].output.flops[0]["forward"] > 0
    for i, (a, b) in enumerate(zip(whole.classes, one.classes, strict=True)):
        assert a.ranks == b.ranks and a.trace == b.trace
        assert a.memory.snapshots == b.memory.snapshots and a.memory.peak == b.memory.peak
        want = a.output if i == 1 else plain
        assert (b.output.ops, b.output.flops) == (want.ops, want.flops), i
    with pytest.raises(ValueError, match=r"count_in .* must be in 0\.\.\d: .* got 9"):
        measure(cfg, count_in=9)


def test_setup_only_holds_the_same_model_states_as_the_full_step():
    for stage in range(4):
        cfg = TrainConfig(stage=stage, n_d=8, model=ODD)
        full, setup = measure(cfg), measure(cfg, setup_only=True)
        assert setup.model_states(0) == full.model_states(0)
        assert full.memory(0).snapshots[-1].current == full.memory(0).snapshots[0].current
        assert setup.classes[0].trace == [] and setup.classes[0].output is None


# -- the meta backend ---------------------------------------------------------------------------------
def _meta(n, dtype=torch.float16):
    return torch.empty(n, dtype=dtype, device="meta")


def test_meta_backend_checks_sizes_against_the_true_world_size():
    backend = MetaBackend(64)
    backend.collective(3, Call("all_gather", _meta(2), _meta(128)))
    with pytest.raises(CollectiveError, match=r"output of 100 elements .* must be 64 × its input of 2"):
        backend.collective(3, Call("all_gather", _meta(2), _meta(100)))
    with pytest.raises(CollectiveError, match=r"input of 10 elements .* must be 64 × its output of 1"):
        backend.collective(3, Call("reduce_scatter", _meta(10), _meta(1), "sum"))
    assert backend.srcs[3] == [0]


def test_meta_backend_refuses_real_tensors_and_foreign_ranks():
    backend = MetaBackend(4)
    with pytest.raises(CollectiveError, match="must be a meta tensor, got cpu"):
        backend.collective(0, Call("all_reduce", torch.zeros(4), torch.zeros(4), "sum"))
    with pytest.raises(CollectiveError, match=r"rank must be in 0\.\.3, got 4"):
        backend.collective(4, Call("all_reduce", _meta(4), _meta(4), "sum"))
    with pytest.raises(ValueError, match="n_ranks must be an integer >= 1, got 0"):
        MetaBackend(0)


# -- measure: inputs and failures ------------------------------------------------------------------
def test_measure_names_a_bad_micro_batch():
    with pytest.raises(ValueError, match=r"micro_batch .* must be an integer >= 1, got 0"):
        measure(TrainConfig(stage=0, n_d=4, model=ODD), micro_batch=0)


def test_a_failing_rank_is_named_with_its_phase(monkeypatch):
    def broken(ctx, *args, **kwargs):
        with ctx.phase("forward"):
            raise RuntimeError("boom")
    monkeypatch.setattr(scale_mod, "rank_main", broken)
    with pytest.raises(RankError, match=r"meta rank 0 of 4 failed in phase 'forward' .*boom"):
        measure(TrainConfig(stage=0, n_d=4, model=ODD))


def test_rank_outside_the_world_is_refused():
    r = measure(TrainConfig(stage=1, n_d=4, model=ODD), setup_only=True)
    with pytest.raises(ValueError, match=r"rank must be in 0\.\.3, got 4"):
        r.model_states(4)


# -- presets ---------------------------------------------------------------------------------------
def test_paper_presets_have_the_stated_exact_psi():
    """Ψ counted from the fp16 parameters the stage-0 setup allocates (2 bytes each, C2)."""
    stated = {"1.5B": 1_557_611_200, "7.5B": 7_499_274_240, "128B": 128_480_755_712,
              "1T": 1_007_988_403_200}
    measured = {name: measure(TrainConfig(stage=0, n_d=1, model=p.model),
                              setup_only=True).memory(0).current["param16"] // 2
                for name, p in PAPER.items()}
    assert measured == stated


def test_unknown_preset_lists_the_accepted_names():
    with pytest.raises(ValueError, match=r"unknown preset '9B'; accepted: 1\.5B, 7\.5B, 128B, 1T, t4-"):
        preset("9B")
    assert len(PRESETS) == 4 + 21 + 10


# -- the command line -----------------------------------------------------------------------------
def test_cli_scale_prints_one_row_per_stage(capsys):
    from zerospec.__main__ import main
    rc = main(["scale", "--layers", "2", "--hidden", "15", "--heads", "3", "--vocab", "37",
               "--seq", "12", "--gpus", "64", "--stages", "0,3"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "Ψ = 6,555; N_d = 64" in out
    rows = [line for line in out.splitlines() if line.startswith("| DP") or line.startswith("| P_")]
    assert [r.split(" | ")[0] for r in rows] == ["| DP", "| P_os+g+p"]
    assert rows[1].endswith("| 0, 30, 61, 62, 63 |")       # the five rank classes of ODD at 64


def test_cli_scale_lists_presets_with_their_exact_psi(capsys):
    from zerospec.__main__ import main
    assert main(["scale", "--list"]) == 0
    assert "| 1T | 128 | 25600 | 160 | 1,007,988,403,200 |" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--stages", "0,5"], "--stages must be a comma-separated list of 0, 1, 2, 3; got '0,5'"),
    (["--gpus", "0"], "argument --gpus: expected an integer >= 1, got '0'"),
    (["--preset", "9B"], "unknown preset '9B'; accepted: 1.5B"),
    (["--preset", "1T", "--layers", "2"], "give either --preset or --layers"),
    (["--hidden", "64"], "a custom model needs at least --layers and --hidden"),
    (["--layers", "2", "--hidden", "128", "--heads", "3"], "--hidden 128 must be divisible by --heads 3"),
    (["--layers", "2", "--hidden", "1000"], "--hidden 1000 must be divisible by heads (default"),
    (["--offload-optimizer", "cpu"], "--offload-optimizer (ZeRO-Offload) is built on stages 2 and 3"),
    (["--out", "x"], "(or the bytes per link with offload: add --offload-optimizer"),
])
def test_cli_scale_names_bad_input(argv, message, capsys):
    from zerospec.__main__ import main
    assert main(["scale", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("stage,kw", [
    pytest.param(2, {"offload_optimizer": "cpu", "offload_mode": "deepspeed"},
                 marks=pytest.mark.slow),
    pytest.param(3, {"offload_optimizer": "nvme"}, marks=pytest.mark.slow),
    (3, {"offload_optimizer": "cpu", "offload_params": "cpu"}),
    pytest.param(3, {"offload_optimizer": "cpu", "offload_params": "nvme"}, marks=pytest.mark.slow)],
    ids=["offload", "nvme", "infinity", "infinity-nvme"])
def test_representative_ranks_give_every_ranks_host_and_nvme_ledgers_as_threads(stage, kw):
    """ZeRO-Offload and ZeRO-Infinity on meta (host and NVMe ledgers of meta tensors, no swap
    file written): every rank's device ledger, records (its PCIe and NVMe copies among them) and
    host and NVMe ledgers, rebuilt from the representatives, equal the 12 threads'."""
    n_d = 12
    full = train(TrainConfig.of(stage=stage, n_d=n_d, model=ONE_LAYER, steps=1, global_batch=n_d,
                                device="meta", **kw))
    scaled = measure(TrainConfig.of(stage=stage, n_d=n_d, model=ONE_LAYER, **kw))
    _assert_same_ledgers(full, scaled, n_d)
    for r in range(n_d):
        for mine, theirs in ((scaled.host(r), full.host[r]), (scaled.nvme(r), full.nvme[r])):
            assert (mine.snapshots, mine.peak, mine.peak_total, mine.total) == \
                (theirs.snapshots, theirs.peak, theirs.peak_total, theirs.total), r
    assert all(full.comm.link_bytes(r, group="host") > 0 for r in range(n_d))


def test_cli_scale_with_offload_prints_tiers_and_draws_the_links(capsys, tmp_path):
    """`scale --offload-optimizer cpu --out DIR`: a line per stage with its host and PCIe bytes,
    and DIR/link_bytes.svg with a bar per stage and direction, with and without offload."""
    from zerospec.__main__ import main
    assert main(["scale", "--layers", "1", "--hidden", "64", "--seq", "16", "--vocab", "64",
                 "--gpus", "4", "--stages", "2", "--offload-optimizer", "cpu",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "stage 2: device " in out and "PCIe down (device → host)" in out
    svg = (tmp_path / "link_bytes.svg").read_text()
    assert 'id="ZeRO-2:to_host"' in svg and 'id="ZeRO-2, Offload cpu (paper):from_host"' in svg
