"""Bytes inside vs across nodes, per collective: what a measured step puts on the links inside a
node and on those that leave it (spec/nodes.md defines a node's cross-node volume), for
``plan --explain``, ``scale --out`` and spec/zeropp.md's figure.

Read from the step's ledger, the observer of every send: each record's ``link`` is the class of the
hop its rank's side took (``intra`` or ``inter``), so a node's bytes across are
``ledger.crossing_bytes(node)`` split by collective, and its bytes inside the rest of its GPUs'
sends (``host`` copies are neither).
"""
from __future__ import annotations

import dataclasses

from ..paper import hardware

# the collectives, in step order; a step books only some of them
COLLECTIVES = ("forward all-gather", "backward all-gather", "gradient reduce-scatter / all-to-all",
               "gradient all-reduce", "replica all-reduce (MiCS)", "parameter all-gather (update)",
               "other")
LINKS = hardware.LINKS[:2]      # the node links of the one taxonomy: inside, across


def collective(rec) -> str:
    """The collective a ledger record belongs to (by op, phase and group)."""
    if rec.op == "all_gather":
        return {"forward": COLLECTIVES[0], "backward": COLLECTIVES[1]}.get(rec.phase, COLLECTIVES[5])
    if rec.op in ("reduce_scatter", "all_to_all"):      # qgZ's all-to-all replaces the RS
        return COLLECTIVES[2]
    if rec.op == "all_reduce":
        return COLLECTIVES[4] if rec.group == "replica" else COLLECTIVES[3]
    return COLLECTIVES[6]


@dataclasses.dataclass(frozen=True)
class NodeBytes:
    """One node's sends in a step: ``sent[collective][link]`` = bytes per GPU of the node (in rank
    order), link "intra" (inside the node) or "inter" (across nodes)."""

    node: int
    ranks: tuple[int, ...]
    psi_padded: int                      # M: Ψ padded, the unit of ZeRO++'s claims
    sent: dict[str, dict[str, tuple[int, ...]]]

    def node_total(self, coll: str, link: str) -> int:
        return sum(self.sent[coll][link])

    def busiest(self, coll: str, link: str) -> int:
        """The most bytes one GPU of the node sent (a flat ring: the node's last GPU, across)."""
        return max(self.sent[coll][link])

    def across(self) -> int:
        return sum(self.node_total(c, "inter") for c in self.sent)

    def inside(self) -> int:
        return sum(self.node_total(c, "intra") for c in self.sent)


def node_bytes(result, node: int = 0) -> NodeBytes:
    """:class:`NodeBytes` of ``node`` in a measured step (a ScaleResult, or a TrainResult's config
    and ledger through ``result.comm_ledger``), which must have been run with GPUs per node."""
    cfg = result.config
    g = cfg.gpus_per_node
    if g is None:
        raise ValueError("bytes across nodes need the GPUs per node (--gpus-per-node G); without "
                         "it every rank sits on one node and nothing crosses")
    ranks = tuple(range(node * g, (node + 1) * g))
    led = result.comm_ledger(ranks)
    sent = {c: {link: [0] * g for link in LINKS} for c in COLLECTIVES}
    for i, r in enumerate(ranks):
        for rec in led.records(r):
            if rec.link in LINKS:
                sent[collective(rec)][rec.link][i] += rec.bytes_sent
    kept = {c: {k: tuple(v) for k, v in by.items()} for c, by in sent.items()
            if any(any(v) for v in by.values())}
    return NodeBytes(node, ranks, result.psi_padded, kept)


def run_label(cfg) -> str:
    """A step's stage and node settings, short: "ZeRO-3, hpZ h = 8, qwZ, qgZ", "ZeRO-3, MiCS p = 8"."""
    parts = [f"ZeRO-{cfg.stage}" if cfg.stage else "DP"]
    parts += [f"hpZ h = {cfg.hpz}"] if cfg.hpz > 1 else []
    parts += ["qwZ"] if cfg.qwz else []
    parts += ["qgZ"] if cfg.qgz else []
    parts += [f"MiCS p = {cfg.shard_group}"] if cfg.shard_group else []
    return ", ".join(parts)


def node_table(nb: NodeBytes, title: str, units: str = "GB"):
    """Per collective: bytes inside and across, per node and from the busiest GPU; a total row."""
    from ..render.format import Table, fmt_bytes
    g = lambda v: fmt_bytes(v, units)        # noqa: E731
    n = len(nb.ranks)
    t = Table("node_bytes", title,
              ["Collective", "Inside node: per node (B)", "Across nodes: per node (B)",
               f"Across: per node ({units})", "Across: busiest GPU (B)", "Across, in M"],
              fmt={3: g})
    for c in nb.sent:
        across = nb.node_total(c, "inter")
        t.add(c, f"{nb.node_total(c, 'intra'):,}", f"{across:,}", across,
              f"{nb.busiest(c, 'inter'):,}", f"{across / (2 * nb.psi_padded):.4f}M")
    t.add("total", f"{nb.inside():,}", f"{nb.across():,}", nb.across(), "",
          f"{nb.across() / (2 * nb.psi_padded):.4f}M")
    t.notes.append(f"Node {nb.node} (GPUs {nb.ranks[0]}–{nb.ranks[-1]}, {n} per node), one step: "
                   f"bytes its GPUs send over links inside the node and over links that leave it "
                   f"(spec/nodes.md); the busiest GPU is the one that sends the most across. "
                   f"M = Ψ padded = {nb.psi_padded:,}; in M = bytes / 2 (fp16 elements) / M, "
                   f"ZeRO++'s unit.")
    return t


def markdown(runs: dict[str, NodeBytes]) -> str:
    """The figure's data as a table of integers: per run and collective, node 0's bytes inside
    and across (what the spec figure draws, pinned by a snapshot)."""
    rows = ["| run | collective | inside node (B) | across nodes (B) | across, busiest GPU (B) |",
            "|---|---|---|---|---|"]
    for name, nb in runs.items():
        for c in nb.sent:
            rows.append(f"| {name} | {c} | {nb.node_total(c, 'intra'):,} "
                        f"| {nb.node_total(c, 'inter'):,} | {nb.busiest(c, 'inter'):,} |")
    return "\n".join(rows)


def figure(runs: dict[str, NodeBytes], title: str):
    """Two panels, inside the node and across nodes (each its own scale: across is the smaller):
    per run a bar of node 0's bytes per step, stacked by collective. Returns the matplotlib figure
    (its axes titled by link; each bar segment's gid is "link:collective")."""
    from ..render.savefig import pyplot
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    names = list(runs)
    colls = [c for c in COLLECTIVES if any(c in nb.sent for nb in runs.values())]
    colours = dict(zip(COLLECTIVES, ("#4c72b0", "#55a868", "#c44e52", "#8172b2", "#ccb974",
                                     "#64b5cd", "#999999")))
    for ax, link, label in zip(axes, LINKS, ("inside the node", "across nodes")):
        top = max(sum(nb.node_total(c, link) for c in nb.sent) for nb in runs.values()) or 1
        scale, unit = next((10 ** e, u) for e, u in ((9, "GB"), (6, "MB"), (3, "kB"), (0, "B"))
                           if top >= 10 ** e or e == 0)
        base = [0.0] * len(names)
        for c in colls:
            ys = [runs[n].node_total(c, link) / scale if c in runs[n].sent else 0.0 for n in names]
            ax.bar(names, ys, bottom=base, color=colours[c], label=c, gid=f"{link}:{c}")
            base = [a + b for a, b in zip(base, ys)]
        ax.set_title(f"bytes {label}, node 0", fontsize=10)
        ax.set_ylabel(f"{unit} per step, node 0's GPUs together")
        ax.set_ylim(0, top / scale * 1.08)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        ax.grid(axis="y", linewidth=0.3)
    axes[1].legend(fontsize=8, loc="upper right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def save(runs: dict[str, NodeBytes], out, title: str, name: str = "node_bytes"):
    """DIR/``name``.svg (and .png) of :func:`figure`; the SVG's path."""
    from ..render.savefig import save_svg
    return save_svg(figure(runs, title), out, name)


# spec/zeropp.md's figure: ZeRO-3, each of ZeRO++'s pieces, all three, and MiCS, at ZeRO++'s scale
FIGURE_MODEL, FIGURE_GPUS, FIGURE_PER_NODE = "t4-100B-125x8192", 384, 8
FIGURE_RUNS = {"ZeRO-3": {}, "hpZ h = 8": {"hpz": 8}, "qwZ": {"qwz": True}, "qgZ": {"qgz": True},
               "hpZ + qwZ + qgZ": {"hpz": 8, "qwz": True, "qgz": True},
               "MiCS p = 8": {"shard_group": 8}}
FIGURE_TITLE = ("100B shape, stage 3 on 384 meta GPUs as 48 nodes × 8: bytes node 0 sends per step")


def figure_runs(step=None) -> dict[str, NodeBytes]:
    """Node 0's :class:`NodeBytes` for each of FIGURE_RUNS; ``step(**settings)`` gives the measured
    step (default: :func:`zerospec.training.scale.measure` of the figure's shape)."""
    if step is None:
        from ..model.presets import preset
        from ..training.config import TrainConfig
        from ..training.scale import measure

        def step(**kw):
            return measure(TrainConfig.of(model=preset(FIGURE_MODEL).model, stage=3,
                                          n_d=FIGURE_GPUS, gpus_per_node=FIGURE_PER_NODE, **kw))
    return {name: node_bytes(step(**kw)) for name, kw in FIGURE_RUNS.items()}
