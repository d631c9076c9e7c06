"""zerospec/plan/nodes.py: a node's bytes inside vs across nodes per collective, read from a
measured step's ledger, as `plan --explain`, `scale --out` and spec/zeropp.md's figure show them."""
from __future__ import annotations

import functools

import pytest

from zerospec.model.gpt import GPTConfig
from zerospec.plan import nodes
from zerospec.training.scale import measure
from zerospec.training.config import TrainConfig

SMALL = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=64)


@functools.lru_cache(maxsize=None)
def step(**kw):
    """Stage 3 on 8 meta GPUs as 2 nodes × 4."""
    return measure(TrainConfig.of(stage=3, n_d=8, model=SMALL, gpus_per_node=4, **kw))


RUNS = {"ZeRO-3": {}, "hpZ": {"hpz": 4}, "all three": {"hpz": 4, "qwz": True, "qgz": True},
        "MiCS": {"shard_group": 4}}


@pytest.mark.parametrize("name", RUNS)
def test_across_is_the_ledgers_crossing_and_inside_the_rest(name):
    """Per collective, node 0's across bytes are the ledger's crossing_bytes of it; inside, its
    GPUs' intra sends; nothing else is counted (host copies are neither)."""
    r = step(**RUNS[name])
    nb, led = nodes.node_bytes(r), r.comm_ledger(range(4))
    assert nb.across() == led.crossing_bytes(0) > 0
    assert nb.inside() == sum(led.bytes(k, link="intra") for k in range(4)) > 0
    assert nb.node_total("forward all-gather", "inter") == led.crossing_bytes(
        0, phase="forward", op="all_gather")
    assert nb.node_total("gradient reduce-scatter / all-to-all", "inter") == sum(
        led.crossing_bytes(0, op=op) for op in ("reduce_scatter", "all_to_all"))
    assert "other" not in nb.sent                            # every collective of stage 3 named
    ag = nb.sent.get("backward all-gather", {"inter": (0,)})
    assert (sum(ag["inter"]) == 0) == (name != "ZeRO-3")     # hpZ and MiCS keep it in the node


def test_the_table_puts_each_link_in_its_column():
    """node_table: the across column is crossing_bytes, the inside column the intra sends."""
    r = step()
    nb, led = nodes.node_bytes(r), r.comm_ledger(range(4))
    t = nodes.node_table(nb, "t")
    total = t.rows[-1]
    assert total[0] == "total" and int(total[2].replace(",", "")) == led.crossing_bytes(0)
    assert int(total[1].replace(",", "")) == sum(led.bytes(k, link="intra") for k in range(4))
    flat = t.rows[0]      # forward all-gather: only the node's last GPU sends across
    assert flat[4] == flat[2]


def test_the_figure_draws_across_in_the_across_panel():
    """The figure's "across nodes" panel stacks node 0's crossing bytes per run, the other its
    intra bytes: the bars' heights times the axis unit are the ledger's sums."""
    runs = {name: nodes.node_bytes(step(**kw)) for name, kw in RUNS.items()}
    fig = nodes.figure(runs, "t")
    try:
        for ax in fig.axes:
            link = "inter" if "across" in ax.get_title() else "intra"
            unit = {"GB": 10**9, "MB": 10**6, "kB": 10**3, "B": 1}[ax.get_ylabel().split()[0]]
            for i, name in enumerate(runs):
                drawn = sum(p.get_height() for p in ax.patches if p.get_gid().startswith(link)
                            and round(p.get_x() + p.get_width() / 2) == i)
                want = runs[name].across() if link == "inter" else runs[name].inside()
                assert drawn * unit == pytest.approx(want, rel=1e-12)   # float axis units
    finally:
        from zerospec.render.savefig import pyplot
        pyplot().close(fig)


def test_run_labels_name_the_settings():
    """A run's label names its stage and each of hpZ, qwZ, qgZ, MiCS it has."""
    assert nodes.run_label(step(hpz=4, qwz=True, qgz=True).config) == "ZeRO-3, hpZ h = 4, qwZ, qgZ"
    assert nodes.run_label(step(shard_group=4).config) == "ZeRO-3, MiCS p = 4"


def test_without_nodes_there_is_nothing_across_to_read():
    """A step on one node: the reader refuses, naming --gpus-per-node."""
    with pytest.raises(ValueError, match="--gpus-per-node G"):
        nodes.node_bytes(measure(TrainConfig(stage=3, n_d=4, model=SMALL)))


def test_node_one_is_read_from_its_own_gpus():
    """Node 1 of 2 × 4 holds GPUs 4–7 (node k: ranks k·G … (k+1)·G − 1, the ledger's Nodes), and
    each GPU's across bytes are that GPU's own inter sends: in a flat ring only its last GPU, 7,
    sends across (to 0)."""
    r = step()
    nb, led = nodes.node_bytes(r, node=1), r.comm_ledger()
    assert nb.ranks == tuple(led.nodes.ranks_of(1)) == (4, 5, 6, 7)
    fwd = nb.sent["forward all-gather"]["inter"]
    assert fwd == tuple(led.bytes(k, link="inter", phase="forward", op="all_gather")
                        for k in (4, 5, 6, 7))
    assert fwd[:3] == (0, 0, 0) and fwd[3] > 0
    assert nb.across() == led.crossing_bytes(1)
