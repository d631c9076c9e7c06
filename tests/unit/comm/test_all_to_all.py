"""all_to_all (qgZ's collective): torch.distributed semantics on both simulated transports, booked
in the ledger on the link class each piece's hop takes, as the wire saw it."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from zerospec import VirtualCluster
from zerospec.comm.groups import global_group, local_group
from zerospec.runtime.errors import RankError

N, G = 8, 4      # 2 nodes × 4 GPUs


def _run(transport: str, dtype=torch.uint8, c: int = 3):
    """Every rank all-to-alls inside its node, then across nodes (one GPU per node)."""
    def fn(ctx):
        x = torch.arange(N * c, dtype=torch.int32).add(100 * ctx.rank).to(dtype)
        loc = ctx.comm.subgroup(local_group(ctx.rank, G))
        out = torch.empty_like(x[:G * c])
        loc.all_to_all(out, x[:G * c])
        glob = ctx.comm.subgroup(global_group(ctx.rank, G, N))
        out2 = torch.empty_like(x[:2 * c])
        glob.all_to_all(out2, x[:2 * c])
        return out, out2
    cluster = VirtualCluster(N, transport=transport, gpus_per_node=G)
    return cluster, cluster.run(fn)


@pytest.mark.parametrize("transport", ["direct", "ring"])
def test_piece_k_of_my_output_is_rank_ks_piece_for_me(transport):
    """Rank r's output piece k is group member k's input piece r (index r: r's place in the
    group), on the default and on the ring transport."""
    c = 3
    _, outs = _run(transport, torch.int32, c)
    for r, (loc, glob) in enumerate(outs):
        members = local_group(r, G).ranks
        want = torch.cat([torch.arange(members.index(r) * c, members.index(r) * c + c) + 100 * k
                          for k in members])
        assert torch.equal(loc, want.to(torch.int32))
        gm = global_group(r, G, N).ranks
        want = torch.cat([torch.arange(gm.index(r) * c, gm.index(r) * c + c) + 100 * k for k in gm])
        assert torch.equal(glob, want.to(torch.int32))


def test_the_ledger_books_each_piece_on_the_link_class_the_wire_saw():
    """Per sender and link class, booked elements and bytes equal the wire's point-to-point
    counts: the node's group on intra links, the one-GPU-per-node group on inter links; a rank
    keeps its own piece: (n−1)/n of its input sent."""
    cluster, _ = _run("ring")
    led, wire = cluster.comm_ledger, cluster.wire
    seen, seen_b = Counter(), Counter()
    for rec in wire.records:
        for (src, dst), e in rec.elements.items():
            cls = "intra" if src // G == dst // G else "inter"
            seen[src, cls] += e
            seen_b[src, cls] += rec.bytes[src, dst]
    booked, booked_b = Counter(), Counter()
    for rec in led.records(op="all_to_all"):
        booked[rec.rank, rec.link] += rec.elements_sent
        booked_b[rec.rank, rec.link] += rec.bytes_sent
    assert booked == seen and booked_b == seen_b
    assert {r.link for r in led.records(group="local")} == {"intra"}
    assert {r.link for r in led.records(group="global")} == {"inter"}
    assert [r.elements_sent for r in led.records(0)] == [3 * 3, 1 * 3]   # (G−1)·c, (n−1)·c
    assert wire.leaving(0, bytes=True) == led.crossing_bytes(0) == G * 3


def test_an_all_to_all_whose_peers_straddle_nodes_is_refused():
    """The ledger books one link class per record: a group that mixes intra- and inter-node
    peers (the world, over 2 nodes) is refused, naming the group and what is accepted."""
    def fn(ctx):
        x = torch.zeros(N)
        ctx.comm.all_to_all(torch.empty_like(x), x)
    with pytest.raises(RankError, match=r"all_to_all over 'world'.*both intra- and inter-node "
                                        r"links; accepted: a group inside one node or one GPU"):
        VirtualCluster(N, gpus_per_node=G).run(fn)
