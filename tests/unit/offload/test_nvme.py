"""The NVMe tier (zerospec/offload/nvme.py): swap files that really hold the bytes, written
atomically, whose failures name the file and leave the previous step whole; and an offloaded
run on it, checked against the files on disk (os.stat, numpy's own reader) as its observer."""
from __future__ import annotations

import dataclasses
import errno
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from tests.support.runs import assert_same_training
from zerospec.model.gpt import ODD
from zerospec.offload import NvmeError, SwapDir
from zerospec.runtime.errors import ClusterError
from zerospec.testing.faults import inject_nvme_fault
from zerospec.training import checkpoint
from zerospec.training.config import TrainConfig
from zerospec.training.run import train

N = 4


def cfg(path, stage: int = 2, steps: int = 3, n_d: int = N, **kw) -> TrainConfig:
    return TrainConfig.of(stage=stage, n_d=n_d, model=ODD, steps=steps, offload_optimizer="nvme",
                          nvme_path=str(path), **kw)


def on_host(c: TrainConfig) -> TrainConfig:
    """``c`` on the cpu tier: the same bits (test_an_nvme_run_is_bit_identical…), no fsync."""
    return c.replace(offload_optimizer="cpu", nvme_path=None)


def test_an_empty_path_is_refused_before_a_swap_file_lands_in_the_working_directory(
        tmp_path, monkeypatch):
    """An empty nvme_path would be pathlib's "." (the working directory): refused, by the
    configuration and by the tier itself, and no rank directory is made."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="nvme_path '' is empty"):
        cfg("")
    with pytest.raises(ValueError, match="nvme_path '' is empty"):
        SwapDir("", 0)
    assert list(tmp_path.iterdir()) == []


def test_a_tensor_written_is_read_back_bit_for_bit(tmp_path):
    """A shard goes to a file of exactly its bytes and comes back equal; before the commit only a
    .partial file exists, which nothing reads."""
    swap = SwapDir(tmp_path, rank=0)
    t = torch.randn(1000)
    assert swap.write("w", t) == 4000
    assert swap.on_disk() == {} and (swap.dir / "w.partial").exists()
    swap.commit()
    assert swap.on_disk() == {"w": 4000}
    assert np.array_equal(np.fromfile(swap.path("w"), dtype=np.float32), t.numpy())
    back = torch.empty(1000)
    swap.read("w", back)
    assert torch.equal(back, t)


def test_a_file_is_synced_whole_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    """Durable before visible: each .partial file is fsync-ed, holding all its bytes, before the
    commit renames it over its .swap file (the directory synced last), so a crash after the rename
    cannot leave a .swap file the disk never got. Observed on the file descriptors: every fsync
    records the inode and size it synced, every rename the inode it moves."""
    events, fsync, replace = [], os.fsync, os.replace

    def synced(fd):
        st = os.fstat(fd)
        events.append(("fsync", st.st_ino, st.st_size))
        return fsync(fd)

    def renamed(src, dst):
        events.append(("rename", os.stat(src).st_ino, pathlib.Path(dst).name))
        return replace(src, dst)

    monkeypatch.setattr(os, "fsync", synced)
    monkeypatch.setattr(os, "replace", renamed)
    swap = SwapDir(tmp_path, rank=0)
    sizes = {"a": 4 * 1000, "b": 2 * 300}
    swap.write("a", torch.randn(1000))
    swap.write("b", torch.zeros(300, dtype=torch.float16))
    swap.commit()
    renames = [(k, e) for k, e in enumerate(events) if e[0] == "rename"]
    assert [e[2] for _, e in renames] == ["a.swap", "b.swap"]
    for k, (_, ino, name) in renames:
        assert ("fsync", ino, sizes[name[0]]) in events[:k], name     # synced whole, before
    assert events[-1][0] == "fsync" and events[-1][1] == os.stat(swap.dir).st_ino   # then the dir


def test_a_stale_partial_file_is_removed_not_read(tmp_path):
    """A .partial file left by a killed write is deleted when the directory is opened again."""
    (tmp_path / "rank0").mkdir()
    (tmp_path / "rank0" / "w.partial").write_bytes(b"half")
    swap = SwapDir(tmp_path, rank=0)
    assert list(swap.dir.iterdir()) == []


def test_a_file_of_the_wrong_size_is_refused_naming_it(tmp_path):
    swap = SwapDir(tmp_path, rank=0)
    swap.path("w").write_bytes(b"\0" * 12)
    with pytest.raises(NvmeError, match="w.swap.*holds 12 bytes, expected 16"):
        swap.read("w", torch.empty(4))


@pytest.mark.parametrize("stage", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_an_nvme_run_is_bit_identical_and_its_files_hold_the_states(tmp_path, stage):
    """Offloading to NVMe changes no bit; after the run each rank's files hold its fp32 master,
    momentum and variance (read back by numpy, not by the tier), their sizes are the NVMe ledger's,
    and every step reads and writes 12 bytes per owned element over the nvme link."""
    r = train(cfg(tmp_path, stage, n_d=2))
    assert_same_training(r, train(r.config.replace(offload_optimizer=None, nvme_path=None)))
    for rank in range(r.config.n_d):
        d = tmp_path / f"rank{rank}"
        sizes = {p.name: p.stat().st_size for p in d.iterdir()}
        assert not [n for n in sizes if not n.endswith(".swap")]
        m = sum(u.chunk for u in r.units)
        assert sum(sizes.values()) == 12 * m == sum(r.nvme[rank].current.values())
        for s in range(1, 4):
            assert r.comm.link_bytes(rank, step=s, group="nvme", op="to_nvme") == 12 * m
            assert r.comm.link_bytes(rank, step=s, group="nvme", op="from_nvme") == 12 * m
            assert {x.link for x in r.comm.records(rank, step=s, group="nvme")} == {"nvme"}
        for (sl, master), u in zip(r.ranks[rank].master, r.units):
            on_disk = np.fromfile(d / f"{u.name.replace('/', '.')}.master32.swap", dtype=np.float32)
            assert np.array_equal(on_disk, master.numpy())


def _same_continuation(after, whole) -> None:
    """A resumed run equals the uninterrupted one from where it resumed: losses and masters."""
    assert after.losses == whole.losses[-len(after.losses):]
    assert all(torch.equal(after.master[k], whole.master[k]) for k in whole.master)


def _read_states(d: pathlib.Path) -> dict[str, np.ndarray]:
    return {p.name: np.fromfile(p, dtype=np.float32) for p in sorted(d.glob("*.swap"))}


@pytest.mark.parametrize("code,word", [(errno.ENOSPC, "No space left on device"),
                                       pytest.param(errno.EROFS, "Read-only file system",
                                                    marks=pytest.mark.slow)],
                         ids=["ENOSPC", "EROFS"])
def test_a_failed_write_names_the_file_applies_no_step_and_the_run_resumes(tmp_path, code, word):
    """A full (ENOSPC) or read-only (EROFS) NVMe directory, injected half-way into the third
    swap-file write of step 2: the run fails naming the file; the failing rank's files still hold
    step 1's states and no .partial file is left; resuming from step 1's checkpoint gives the
    uninterrupted run's bits."""
    nv, ck = tmp_path / "nvme", tmp_path / "ckpt"
    nv.mkdir()
    c = cfg(nv, n_d=2)
    whole = train(on_host(c))
    after_1 = train(dataclasses.replace(whole.config, steps=1))
    with pytest.raises(ClusterError) as e, inject_nvme_fault(step=2, write=3, errno_=code) as seen:
        train(c, save={1: ck})
    assert seen["fired"] == 1
    failed = e.value.rank if hasattr(e.value, "rank") else 0
    d = nv / f"rank{failed}"
    assert word in str(e.value) and str(d) in str(e.value), str(e.value)
    assert not list(d.glob("*.partial"))
    by_name = {f"{u.name.replace('/', '.')}.master32.swap": m.numpy()
               for (_, m), u in zip(after_1.ranks[failed].master, after_1.units)}
    on_disk = _read_states(d)
    assert all(np.array_equal(on_disk[k], v) for k, v in by_name.items())
    resumed = train(c, resume=checkpoint.load(ck, n_ranks=2))
    _same_continuation(resumed, whole)


KILLED = textwrap.dedent("""
    import sys
    from zerospec.model.gpt import ODD
    from zerospec.testing.faults import inject_nvme_fault
    from zerospec.training.config import TrainConfig
    from zerospec.training.run import train
    nv, ck = sys.argv[1], sys.argv[2]
    cfg = TrainConfig.of(stage=2, n_d=4, model=ODD, steps=3, offload_optimizer="nvme", nvme_path=nv)
    with inject_nvme_fault(step=2, write=2, kill=True):
        train(cfg, save={1: ck})
    """)


@pytest.mark.slow
def test_a_process_killed_while_writing_a_shard_loses_nothing(tmp_path):
    """A real crash: the process is SIGKILLed half-way through writing a swap file of step 2.
    The half-written .partial file is on disk and the committed files are whole; a new run on
    the same directory never reads it (removes it) and, resumed from step 1's checkpoint, gives
    the uninterrupted run's bits. (~1.5 s: a fresh interpreter imports torch.)"""
    nv, ck = tmp_path / "nvme", tmp_path / "ckpt"
    nv.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.run([sys.executable, "-c", KILLED, str(nv), str(ck)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, p.stderr
    partial = sorted(p.stat().st_size for p in nv.glob("rank*/*.partial"))   # step 2's two writes:
    assert len(partial) == 2 and 0 < partial[0] < partial[1]     # one whole, one cut half-way
    whole = train(on_host(cfg(nv)))
    resumed = train(cfg(nv), resume=checkpoint.load(ck, n_ranks=N))
    assert not list(nv.glob("rank*/*.partial"))
    _same_continuation(resumed, whole)
