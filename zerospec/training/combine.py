"""The one table of what combines: every feature of a run, and for every pair of them, whether they
compose or why they are refused (spec/combine.md renders it as a matrix).

A :class:`Feature` names the stages it runs at, the settings it needs from others (kept when the
feature is taken away) and its own settings (taken away), and whether taking them away leaves
every bit of the run unchanged (``neutral``: it moves bytes, never values). A composing pair with
a neutral feature therefore has a reference: the same run without it, bit for bit
(tests/claims/test_combine.py walks every pair).

``REFUSED`` holds the pairs that stay refused, each with a reason of principle: an approximation
that would break an exactness claim, or a layout with no meaning. :func:`check` raises the table's
message when a run holds a refused pair; TrainConfig calls it, and train() with the run-level
features (checkpoint files, real processes).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools

from ..optim.loss_scale import LossScale

ALL_STAGES = (0, 1, 2, 3)


@dataclasses.dataclass(frozen=True)
class Feature:
    name: str                       # the table's key
    title: str                      # what the matrix shows
    stages: tuple[int, ...] = ALL_STAGES
    sets: tuple = ()                # its own TrainConfig settings: (field, value), …
    needs: tuple = ()               # settings it needs from other features, kept in its reference
    neutral: bool = False           # without ``sets`` the run is the same bit for bit
    flag: str = ""                  # the TrainConfig attribute that says it is on, if not ``sets``
    match: bool = False             # on only with exactly ``sets``' values (a variant of a field)
    serves: tuple = ()              # features whose settings it stands for in another's needs

    def on(self, cfg) -> bool:
        """Whether ``cfg`` uses this feature: its flag, or its own fields (each off its default,
        or with ``match`` each at its value)."""
        if self.flag:
            return bool(getattr(cfg, self.flag))
        if self.match:
            return all(getattr(cfg, f) == v for f, v in self.sets)
        default = _defaults(type(cfg))
        return bool(self.sets) and all(getattr(cfg, f) != default[f] for f, _ in self.sets)


@functools.cache
def _defaults(cls) -> dict:
    """Every option's default: the configuration's own fields' and its sections' (sections.py)."""
    from .sections import SECTIONS
    out = {f.name: f.default for f in dataclasses.fields(cls)}
    for section in SECTIONS.values():
        out.update({f.name: f.default for f in dataclasses.fields(section)})
    return out


def _f(name, title, stages=ALL_STAGES, neutral=False, needs=(), flag="", match=False,
       serves=(), **sets) -> Feature:
    return Feature(name, title, tuple(stages), tuple(sets.items()), tuple(needs), neutral, flag,
                   match, tuple(serves))


NODES = ("gpus_per_node", 4)   # h·N_m GPUs per node: hpZ with MP (N_m = 2) too
AC = ("checkpoint_activations", 1)
MP = ("n_m", 2)
OFFLOAD = ("offload_optimizer", "cpu")
PARAMS = ("offload_params", "cpu")

FEATURES = (
    _f("accum", "gradient accumulation (exact sums on the paper's stages)", flag="accumulates",
       grad_accum_steps=2),
    _f("loss_scale", "dynamic loss scaling", loss_scale=LossScale(init_scale=2.0 ** 10)),
    _f("clip", "gradient clipping", clip_grad_norm=0.5),
    _f("ac", "activation checkpointing", neutral=True, flag="segment_blocks",
       checkpoint_activations=1),
    # a selective mode keeps each checkpointed block's input as a checkpoint, which P_a, P_a+cpu
    # and M_D keep as they keep a segment's (zero_r/checkpointing.py): it serves their need of AC
    _f("sac", "selective activation checkpointing (torchtitan)", neutral=True,
       flag="selective_ac", serves=("ac",), activation_checkpointing="selective-op"),
    _f("mp", "model parallelism (Megatron)", n_m=2),
    # P_a over a group of one without MP (DeepSpeed's mp_size 1: the whole checkpoint), and
    # cpu_checkpointing with or without P_a (DeepSpeed's elif CPU_CHECKPOINT branch): zero_r/partition.py
    _f("pa", "P_a", neutral=True, needs=(AC,), partition_activations=True),
    _f("pa_cpu", "P_a+cpu (checkpoints on the host)", neutral=True, needs=(AC,),
       cpu_checkpointing=True),
    _f("md", "M_D (contiguous checkpoints)", neutral=True, needs=(AC,),
       contiguous_checkpoints=True),
    _f("cb", "C_B buckets", neutral=True, bucket_elements=1000),
    _f("contiguous_gradients", "contiguous gradients", (2, 3), neutral=True,
       contiguous_gradients=True),
    _f("ds3", "DeepSpeed's stage-3 knobs", (3,), neutral=True,
       stage3_persistence_threshold=100, stage3_max_reuse_distance=10 ** 6),
    _f("nodes", "nodes", neutral=True, gpus_per_node=2),
    _f("hpz", "hpZ", (3,), neutral=True, needs=(NODES,), hpz=2),
    # beside hpZ the walk's partition group (p = 2) fits its node of 4, so h = 2 = p: valid, the
    # secondary partition is the group itself; tests/claims/test_mics_hpz.py spans nodes (p > G)
    _f("mics", "MiCS", (1, 2, 3), shard_group=2),
    _f("qwz", "qwZ", (3,), qwz=True),
    _f("qgz", "qgZ", (3,), qgz=True),
    _f("offload", "ZeRO-Offload (cpu)", (2, 3), neutral=True, match=True, offload_optimizer="cpu"),
    _f("nvme", "ZeRO-Offload (nvme)", (2, 3), neutral=True, match=True, offload_optimizer="nvme"),
    _f("params", "offloaded parameters", (3,), neutral=True, needs=(OFFLOAD,),
       offload_params="cpu"),
    _f("prefetch", "parameter prefetch", (3,), neutral=True, needs=(OFFLOAD, PARAMS),
       offload_prefetch=True),
    _f("dpu", "DPU", (2, 3), needs=(OFFLOAD,), dpu=2),
    _f("tiles", "tiles", tiles=2),
    _f("fsdp2", "FSDP2 flavour of stage 3", (3,), needs=(("precision", "bf16"),),
       flavour="fsdp2"),
    _f("meta", "meta tensors", device="meta"),
    Feature("checkpoints", "checkpoint files (save, resume)"),
    Feature("torch", "torch.distributed processes"),
)
BY_NAME = {f.name: f for f in FEATURES}
RUN_LEVEL = ("checkpoints", "torch")   # asked of train(), not of the TrainConfig


def _pair(a: str, b: str) -> frozenset:
    return frozenset((a, b))


REFUSED = {
    _pair("sac", "ac"): "--activation-checkpointing selective-op or selective-layer:K "
    "(torchtitan's rule per block) and --checkpoint-activations K (Megatron's segments of K "
    "blocks, every block inside one) are two rules for which blocks keep what; give one "
    "(torchtitan's full is --checkpoint-activations 1)",
    _pair("fsdp2", "cb"): "C_B fuses several units' gradients into one bucket and gathers "
    "each unit alone; FSDP2's unit of fusion is its parameter group, one fp32 reduce-scatter "
    "buffer per group (foreach_reduce), and its one way to fuse modules, fully_shard([a, b]) "
    "(_fully_shard.py: 'group together for communication'), fuses their all-gathers and "
    "resharding too: a gradient bucket across groups is another engine",
    _pair("fsdp2", "contiguous_gradients"): "M_D for gradients writes every unit's gradient "
    "into one slot, reused as soon as the unit is reduced; FSDP2 holds the root group's "
    "unsharded gradients until the end of backward, while each block's are written: one slot "
    "cannot hold both",
    _pair("fsdp2", "ds3"): "DeepSpeed's persistence threshold and reuse distance decide which "
    "units stay gathered; in the FSDP2 flavour reshard_after_forward, as torchtitan sets it, "
    "decides the same: two rules for one choice (FSDP2's one way to keep a parameter whole, "
    "fully_shard's ignored_params, also leaves its gradient unreduced, _fully_shard.py: not a "
    "persistent unit)",
    _pair("fsdp2", "nvme"): "FSDP2 offloads through its OffloadPolicy, whose one tier is "
    "CPUOffloadPolicy, the host (_fsdp_api.py): the flavour with ZeRO-Offload's cpu tier is that "
    "policy; states in NVMe swap files are a layout FSDP2 has no place for",
    _pair("fsdp2", "dpu"): "under CPUOffloadPolicy the host's fp32 shards are what AdamW updates "
    "in place and what each all-gather copies up; the delayed update would write them while "
    "FWD-BWD fetch them: there is no stale copy to train on",
    _pair("meta", "checkpoints"): "checkpoint files hold values; meta tensors have none",
    _pair("meta", "torch"): "real processes run real tensors; meta tensors have no values to "
    "send",
}
# what a feature needs (hpZ's nodes, P_a's checkpoints, the prefetcher's offloaded parameters) is in its
# ``needs``: a pair with a feature it needs composes as that feature does


def needed(name: str) -> list[str]:
    """The features ``name`` turns on through its ``needs`` (the prefetcher: offloaded
    parameters and ZeRO-Offload; P_a: checkpointing)."""
    needs = set(BY_NAME[name].needs)
    return [f.name for f in FEATURES if f.sets and set(f.sets) <= needs]


# pairs where a neutral feature changes values after all: DeepSpeed's persistent units are never
# gathered, so qwZ quantizes fewer gathers; qgZ's all-to-alls follow the nodes; under MP qwZ
# quantizes each MP index's copy of a replicated parameter (a row-parallel bias) in a group shared
# with that index's own slice, so the copies dequantize differently and the activations the MP
# ranks hold alike drift apart (tests/unit/zero/test_zeropp.py); P_a's all-gather of a checkpoint
# would then assemble one MP rank's slice with the others', but the pair runs without MP (P_a over
# a group of one), where nothing is assembled
NOT_NEUTRAL = {_pair("ds3", "qwz"), _pair("ds3", "qgz"), _pair("nodes", "qgz")}


def _served(names) -> dict:
    """The needs that a feature of ``names`` serves in another's place: needed feature → it."""
    return {s: n for n in names for s in BY_NAME[n].serves}


def _needs(name: str, names) -> tuple:
    """``name``'s needs beside ``names``: less the settings of a feature another one serves."""
    served = [BY_NAME[s] for s in _served(names)]
    return tuple(kv for kv in BY_NAME[name].needs if not any(kv in f.sets for f in served))


def refusal(a: str, b: str) -> str | None:
    """The table's reason ``a`` and ``b`` are not combined, or None when they compose: their own
    pair's, or that of a feature one of them needs (and the other does not serve) with the other."""
    na = [n for n in needed(a) if n not in BY_NAME[b].serves]
    nb = [n for n in needed(b) if n not in BY_NAME[a].serves]
    for x, y in itertools.chain([(a, b)], ((n, b) for n in na), ((a, n) for n in nb)):
        if _pair(x, y) in REFUSED:
            why = REFUSED[_pair(x, y)]
            return why if (x, y) == (a, b) else \
                f"{BY_NAME[x].title} with {BY_NAME[y].title}: {why}"
    return None


def refused_pairs() -> list[tuple[str, str]]:
    """Every refused pair of the table, its own or through a feature one of them needs."""
    return [(a, b) for a, b in itertools.combinations(NAMES, 2) if refusal(a, b)]


def message(a: str, b: str) -> str:
    """The one error message of a refused pair, as every check raises it."""
    return f"{BY_NAME[a].title} with {BY_NAME[b].title} is refused: {refusal(a, b)} (spec/combine.md)"


def active(cfg, run: tuple[str, ...] = ()) -> list[str]:
    """The features ``cfg`` uses, in the table's order, plus the run-level ones in ``run``."""
    return [f.name for f in FEATURES if f.on(cfg) or f.name in run]


def check(cfg, run: tuple[str, ...] = ()) -> None:
    """ValueError with the table's message for the first refused pair ``cfg`` (and the run-level
    features ``run``) holds."""
    for a, b in itertools.combinations(active(cfg, run), 2):
        if refusal(a, b):
            raise ValueError(message(a, b))


def settings(names, n_ranks: int = 4) -> dict:
    """TrainConfig keywords that turn on the features ``names`` together (own settings over
    needed ones), at the highest stage they share; None when they share no stage."""
    feats = [BY_NAME[n] for n in names]
    stages = set(ALL_STAGES).intersection(*(f.stages for f in feats))
    if not stages:
        return None
    kw = {k: v for f in feats for k, v in _needs(f.name, names)}
    kw.update({k: v for f in feats for k, v in f.sets})
    kw["stage"] = max(stages)
    kw["n_d"] = n_ranks // kw.get("n_m", 1)
    return kw


def reference(names, n_ranks: int = 4) -> dict | None:
    """TrainConfig keywords of the run the features ``names`` together equal bit for bit: the
    same settings less a neutral feature's own (what it needs kept, at the same stage), or None
    when none of them is neutral or each is needed by another."""
    kw = settings(names, n_ranks)
    if len(names) == 2 and _pair(*names) in NOT_NEUTRAL:
        return None
    for f in (BY_NAME[n] for n in names):
        own = {k for k, _ in f.sets}
        needed = {k for g in names if g != f.name for k, _ in _needs(g, names)}
        if f.name in _served(names).values() and any(   # it serves another's need: kept too
                _needs(g, names) != BY_NAME[g].needs for g in names if g != f.name):
            needed |= own
        if f.neutral and kw is not None and not own & needed:
            return {k: v for k, v in kw.items() if k not in own}
    return None




def matrix() -> str:
    """The table as Markdown: a matrix of the features (✓ composes, ✗n refused for reason n,
    — the same feature), then the reasons, numbered."""
    refused = [(_pair(a, b), refusal(a, b)) for a, b in refused_pairs()]
    number = {pair: k for k, (pair, _) in enumerate(refused, 1)}
    head = "| | " + " | ".join(f"{k}" for k in range(1, len(FEATURES) + 1)) + " |"
    lines = [head, "|---|" + "---|" * len(FEATURES)]
    for k, a in enumerate(FEATURES, 1):
        cells = ["—" if a is b else f"✗{number[_pair(a.name, b.name)]}"
                 if _pair(a.name, b.name) in number else "✓" for b in FEATURES]
        lines.append(f"| {k}. {a.title} | " + " | ".join(cells) + " |")
    lines += ["", "Refused, and why:", ""]
    for k, (pair, why) in enumerate(refused, 1):
        a, b = sorted(pair, key=NAMES.index)
        lines.append(f"{k}. {BY_NAME[a].title} with {BY_NAME[b].title}: {why}.")
    return "\n".join(lines) + "\n"


NAMES = [f.name for f in FEATURES]
