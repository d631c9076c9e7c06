"""Sharded checkpoints: each rank writes what it owns; a load reshards to any number of ranks.

A checkpoint is a directory, written once:

    manifest.json       what was saved (model layout, step, loss scaler, data stream) and, per
                        file, its rank, size, sha256 and the unit ranges it holds
    rank-00000.pt …     one file per rank that owns something: for each unit, the *real* elements
                        [start, stop) of its chunk — fp16 parameters, fp32 master, exp_avg, exp_avg_sq

Padding is never written (it is a property of N, not of the model) and is re-added by the layout
of whoever loads. A replicated state (stage 0) is written once, by rank 0. With model parallelism
(N_m > 1) a rank's units are its MP index's Megatron slices (zerospec/model/megatron.py): the
checkpoint holds each MP index j's units under the names ``mp{j}/<unit>`` (:func:`unit_spec`),
each written by that index's DP group exactly as at N_m = 1, so it reshards to any N_d — and is
refused at another N_m (zerospec/training/resume.py). Loading checks, before
anything is used, that the manifest parses, every listed file exists with the listed size and
checksum, the model layout is the expected one, and the pieces cover every element of every unit
exactly once; each failure is a :class:`CheckpointError` naming what is wrong.

No data lost: files go to a hidden sibling ``.<name>.partial`` and only a complete, synced
directory is renamed to ``<name>`` (a rename is atomic on POSIX), so a save that dies part-way
leaves no checkpoint at ``<name>`` and every earlier checkpoint untouched. A checkpoint is never
overwritten (saving onto an existing one raises).

Why not torch.distributed.checkpoint: its resharding works on DTensor/ShardedTensor placements of
named parameters, while a ZeRO shard is a chunk of a *flattened, padded* unit; describing that
layout to DCP would take more code than the ~40 lines of resharding here, the sim backend has no
process group for DCP's coordinator, and this format is the same whichever engine wrote it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pathlib
import shutil

import torch

from ..model import megatron
from .state import (KINDS, CheckpointError, TrainState, assemble, layout_pieces, mp_prefix,
                    rank_pieces, unit_spec)

FORMAT, VERSION = "zerospec-checkpoint", 1
MANIFEST = "manifest.json"


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def partial_dir(path: pathlib.Path) -> pathlib.Path:
    return path.parent / f".{path.name}.partial"


@dataclasses.dataclass
class Checkpoint(TrainState):
    """A loaded checkpoint laid out for ``n_ranks`` ranks."""

    n_ranks: int = 1

    def shard(self, rank: int) -> list[dict[str, torch.Tensor]]:
        """Rank ``rank``'s chunk of every unit and kind in the ``n_ranks`` layout (padding as zeros)."""
        return [{k: self.padded(k, i, u)[u.shard(rank)] for k in KINDS}
                for i, u in enumerate(self.units(self.n_ranks))]


# -- writing ---------------------------------------------------------------------------------------
def write_file(path: pathlib.Path, data: bytes) -> None:
    """Write and fsync one file (tests replace this to simulate a crash part-way through a save)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _serialize(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _begin(path: pathlib.Path) -> pathlib.Path:
    if path.exists():
        raise FileExistsError(f"checkpoint {path} already exists; checkpoints are written once "
                              f"(choose a new directory, e.g. one per step)")
    tmp = partial_dir(path)
    shutil.rmtree(tmp, ignore_errors=True)  # left by an earlier save that died
    tmp.mkdir(parents=True)
    return tmp


def _commit(tmp: pathlib.Path, path: pathlib.Path, meta: dict, spec, ranks: list[tuple[int, dict]]) -> None:
    """Write the manifest (from the rank files now on disk) and publish the directory atomically."""
    files = []
    for rank, pieces in ranks:
        f = tmp / rank_file(rank)
        data = f.read_bytes()
        files.append({"name": f.name, "rank": rank, "bytes": len(data),
                      "sha256": hashlib.sha256(data).hexdigest(),
                      "pieces": [[n, p["start"], p["stop"]] for n, p in pieces.items()]})
    manifest = {"format": FORMAT, "version": VERSION, **meta,
                "model": [[n, [[p, list(s)] for p, s in ps]] for n, ps in spec], "files": files}
    write_file(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
    os.rename(tmp, path)                   # atomic: the checkpoint appears complete or not at all
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)                       # make the rename itself durable
    finally:
        os.close(fd)


def save_from_rank(ctx, stage, path, spec, meta: dict, n_m: int = 1) -> None:
    """Called on every rank after a step: write my shard, rank 0 publishes (two barriers).
    ``ctx``: the rank's own (the barriers span the whole N_d × N_m grid); ``stage``: its DP
    group's; ``n_m``: the MP degree (ranks are numbered dp_index · N_m + mp_index)."""
    path = pathlib.Path(path)
    with ctx.phase("checkpoint"):
        if ctx.rank == 0:
            _begin(path)
        ctx.comm.barrier()                 # the partial directory exists and is empty
        pieces = rank_pieces(stage, mp_prefix(n_m, ctx.rank % n_m))
        if pieces:
            write_file(partial_dir(path) / rank_file(ctx.rank), _serialize(pieces))
        # every rank's file is on disk; rank 0 learns which ranks wrote from the layout
        ctx.comm.barrier()
        if ctx.rank == 0:
            ranks = [(r, layout_pieces(stage, r, n_m)) for r in range(ctx.n_ranks)]
            _commit(partial_dir(path), path, meta, spec, [(r, p) for r, p in ranks if p])


def save_state(state: TrainState, path, n_ranks: int) -> None:
    """Write ``state`` as ``n_ranks`` ranks of stages 1–3 would (host side: tests, conversions)."""
    path = pathlib.Path(path)
    tmp = _begin(path)
    ranks = []
    for r in range(n_ranks):
        pieces = {}
        for i, u in enumerate(state.units(n_ranks)):
            s = u.shard(r)
            start, stop = s.start, min(s.stop, u.numel)
            if stop > start:
                pieces[u.name] = {"start": start, "stop": stop,
                                  **{k: state.tensors[k][i][start:stop].clone() for k in KINDS}}
        if pieces:
            write_file(tmp / rank_file(r), _serialize(pieces))
            ranks.append((r, pieces))
    _commit(tmp, path, {**state.meta, "n_ranks": n_ranks}, state.spec, ranks)


# -- reading ---------------------------------------------------------------------------------------
def _fail(path, msg: str):
    raise CheckpointError(f"checkpoint {path}: {msg}")


def read_manifest(path) -> dict:
    path = pathlib.Path(path)
    if not path.is_dir():
        hint = (f" (an unfinished save left {partial_dir(path).name}: it is not a checkpoint)"
                if partial_dir(path).exists() else "")
        _fail(path, f"no such checkpoint directory{hint}")
    f = path / MANIFEST
    if not f.exists():
        _fail(path, f"{MANIFEST} is missing: not a checkpoint, or a save that never finished")
    try:
        m = json.loads(f.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        _fail(path, f"{MANIFEST} is not valid JSON (truncated or corrupt?): {exc}")
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        _fail(path, f"{MANIFEST} is not a {FORMAT} manifest")
    if m.get("version") != VERSION:
        _fail(path, f"format version {m.get('version')!r}, this zerospec reads version {VERSION}")
    return m


def _read_rank_file(path: pathlib.Path, entry: dict) -> dict:
    f = path / entry["name"]
    if not f.exists():
        _fail(path, f"shard {entry['name']} (rank {entry['rank']}) is missing")
    data = f.read_bytes()
    if len(data) != entry["bytes"]:
        _fail(path, f"shard {entry['name']} (rank {entry['rank']}) has {len(data)} bytes, the "
                    f"manifest says {entry['bytes']} (truncated or overwritten)")
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        _fail(path, f"shard {entry['name']} (rank {entry['rank']}) fails its sha256 check (corrupt)")
    pieces = torch.load(io.BytesIO(data), weights_only=True)
    listed = {n: (a, b) for n, a, b in entry["pieces"]}
    if {n: (p["start"], p["stop"]) for n, p in pieces.items()} != listed:
        _fail(path, f"shard {entry['name']} holds other unit ranges than the manifest lists")
    return pieces


def _check_model(path, spec, model, n_m: int = 1) -> None:
    want = unit_spec(model, n_m)
    if spec == want:
        return
    for (n1, p1), (n2, p2) in zip(spec, want):
        if n1 != n2 or p1 != p2:
            diff = [f"{a} {tuple(s)} vs {b} {tuple(t)}" for (a, s), (b, t) in zip(p1, p2) if (a, s) != (b, t)]
            _fail(path, f"model mismatch in unit {n1!r} (checkpoint) vs {n2!r} (expected): "
                        f"{diff[0] if diff else f'{len(p1)} vs {len(p2)} parameters'}")
    _fail(path, f"model mismatch: checkpoint has {len(spec)} units, expected {len(want)}")


def load(path, n_ranks: int | None = None, *, model=None) -> Checkpoint:
    """Read and verify a checkpoint, laid out for ``n_ranks`` ranks (default: as saved).

    ``model`` (a GPTConfig), if given, must match the saved layout. Nothing is returned unless
    every check passes."""
    path = pathlib.Path(path)
    m = read_manifest(path)
    n_ranks = m["n_ranks"] if n_ranks is None else n_ranks
    if not isinstance(n_ranks, int) or n_ranks < 1:
        raise ValueError(f"n_ranks must be an integer >= 1, got {n_ranks!r}")
    spec = [(n, [(p, tuple(s)) for p, s in ps]) for n, ps in m["model"]]
    if model is not None:
        _check_model(path, spec, model, m.get("n_m", 1))
    pieces = {e["name"]: _read_rank_file(path, e) for e in m["files"]}
    meta = {k: v for k, v in m.items() if k not in ("format", "version", "model", "files")}
    st = assemble(spec, meta, pieces, where=f"checkpoint {path}")
    return Checkpoint(st.spec, st.tensors, st.meta, n_ranks=n_ranks)


def consolidate(path, model=None) -> dict[str, torch.Tensor]:
    """Full fp32 weights ("unit/param" → tensor) from a sharded checkpoint: the export format.
    A checkpoint written with N_m > 1 needs ``model`` (its GPTConfig) to put Megatron's slices
    back together (zerospec/model/megatron.py)."""
    st = load(path, model=model)
    n_m = st.meta.get("n_m", 1)
    if n_m > 1 and model is None:
        raise CheckpointError(f"checkpoint {path} holds n_m={n_m} model-parallel slices: "
                              f"consolidate(path, model=...) needs the model to join them")
    units = st.units(1)
    per_index = len(units) // n_m             # MP index j's units follow j − 1's (unit_spec)
    parts = [{} for _ in range(n_m)]
    for k, (u, w) in enumerate(zip(units, st.tensors["master"])):
        j = k // per_index
        unit = u.name.removeprefix(mp_prefix(n_m, j))
        for name, t in u.views(w).items():
            parts[j][f"{unit}/{name}"] = t.clone()
    return parts[0] if n_m == 1 else megatron.unshard(model, parts)


def export(path, out_file, model=None) -> None:
    """Write :func:`consolidate`'s dict with ``torch.save`` (one file, no ZeRO needed to read it)."""
    torch.save(consolidate(path, model), out_file)
