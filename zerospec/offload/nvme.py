"""The NVMe tier: one rank's tensors as files in a directory, so the bytes really move.

**Plain file I/O, not mmap.** A write goes to ``<name>.partial``, is flushed and ``fsync``-ed,
and only then renamed over ``<name>.swap`` (and the directory fsync-ed): the rename is atomic, so
a reader finds the old complete file or the new complete one, never a half-written one; a file is
read with ``readinto`` straight into the destination tensor's memory. mmap would map the file
into the address space and let the page cache write it back whenever it likes: a crash in the
middle of an update leaves a file that is half old, half new, with nothing to tell which — and
an ENOSPC shows up as SIGBUS on a page fault, not as an error naming the directory. Explicit
writes give each failure a place to be caught and named.

A group of writes is committed together (:meth:`SwapDir.commit`): an optimizer step writes every
unit's states to ``.partial`` files first and renames them only when all are on disk, so a step
whose writes fail (ENOSPC, a read-only directory) leaves the previous step's files whole: the
step is not applied. ``.partial`` files left by a killed process are removed when a directory is
opened, never read.

The files are also the NVMe tier's independent observer: their sizes (``os.stat``) are what the
disk holds, compared with the NVMe ledger in the tests.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
import weakref

import torch

SWAP, PARTIAL = ".swap", ".partial"
CHUNK = 64 << 20        # bytes per write call: a fault can land between two of them


class NvmeError(OSError):
    """A swap file could not be written or read; the message names the file and the directory."""


def write_bytes(f, data: memoryview) -> None:
    """Write ``data`` to the open file ``f`` in CHUNK pieces (the fault hooks' seam:
    zerospec/testing/faults.py patches it to fail or stop half-way)."""
    for k in range(0, len(data), CHUNK):
        f.write(data[k:k + CHUNK])


def _bytes_of(t: torch.Tensor) -> memoryview:
    return memoryview(t.detach().contiguous().view(torch.uint8).numpy()).cast("B")


def check_dir(path) -> pathlib.Path:
    """``path`` as a directory this process may write into; ValueError naming it otherwise. Write
    access is tried (a temporary file made and removed), not read from the mode bits, which
    neither a superuser nor a read-only or virtual file system obeys."""
    if not str(path).strip():
        raise ValueError(f"nvme_path {str(path)!r} is empty: give the directory for the NVMe "
                         f"tier's swap files, or none for a temporary one")
    p = pathlib.Path(path)
    if not p.is_dir():
        raise ValueError(f"nvme_path {str(p)!r} is not a directory (it must exist: the NVMe tier "
                         f"writes its swap files there)")
    try:
        fd, probe = tempfile.mkstemp(dir=p, prefix=".zerospec-probe-")
    except OSError as e:
        raise ValueError(f"nvme_path {str(p)!r} is not writable ({e.strerror}): the NVMe tier "
                         f"writes its swap files there") from None
    os.close(fd)
    os.unlink(probe)
    return p


class SwapDir:
    """One rank's swap files under ``root/rank<r>``; ``root`` None: a temporary directory,
    removed when this object goes."""

    def __init__(self, root, rank: int):
        if root is None:
            self.dir = pathlib.Path(tempfile.mkdtemp(prefix=f"zerospec-nvme-rank{rank}-"))
            weakref.finalize(self, shutil.rmtree, str(self.dir), True)
        else:
            self.dir = check_dir(root) / f"rank{rank}"
            try:
                self.dir.mkdir(exist_ok=True)
            except OSError as e:
                raise NvmeError(e.errno, f"NVMe tier: cannot create {str(self.dir)!r} in "
                                         f"nvme_path {str(root)!r}: {e.strerror}") from e
        for stale in self.dir.glob("*" + PARTIAL):   # a killed write: never read, removed
            stale.unlink()
        self._pending: list[pathlib.Path] = []

    def path(self, name: str) -> pathlib.Path:
        return self.dir / (name + SWAP)

    def write(self, name: str, t: torch.Tensor) -> int:
        """Write ``t``'s bytes to ``name``'s ``.partial`` file, synced to disk; visible only after
        :meth:`commit`. Returns the bytes written."""
        tmp = self.dir / (name + PARTIAL)
        self._pending.append(tmp)
        data = _bytes_of(t)
        try:
            with open(tmp, "wb") as f:
                write_bytes(f, data)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            self.abort()
            raise NvmeError(e.errno, f"NVMe tier: writing {str(tmp)!r} failed ({e.strerror or e}); "
                                     f"the step is not applied, the files in {str(self.dir)!r} "
                                     f"hold the previous one") from e
        return len(data)

    def commit(self) -> None:
        """Rename every pending ``.partial`` file over its ``.swap`` file (atomic each), then sync
        the directory so the renames are durable."""
        for tmp in self._pending:
            os.replace(tmp, tmp.with_suffix(SWAP))
        self._pending.clear()
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def abort(self) -> None:
        """Drop the pending writes: their ``.partial`` files go, the ``.swap`` files stay."""
        for tmp in self._pending:
            tmp.unlink(missing_ok=True)
        self._pending.clear()

    def read(self, name: str, out: torch.Tensor) -> int:
        """Read ``name``'s committed file into ``out`` (its size must be ``out``'s bytes)."""
        p = self.path(name)
        view = _bytes_of(out) if out.is_contiguous() else None
        if view is None:
            raise ValueError("read needs a contiguous destination tensor")
        try:
            size = p.stat().st_size
            if size != len(view):
                raise NvmeError(0, f"NVMe tier: {str(p)!r} holds {size} bytes, expected {len(view)}")
            with open(p, "rb") as f:
                got = f.readinto(view)
        except NvmeError:
            raise
        except OSError as e:
            raise NvmeError(e.errno, f"NVMe tier: reading {str(p)!r} failed ({e.strerror})") from e
        if got != len(view):
            raise NvmeError(0, f"NVMe tier: {str(p)!r} gave {got} of {len(view)} bytes")
        return got

    def on_disk(self) -> dict[str, int]:
        """name -> bytes of every committed file (os.stat): the tier's independent observer."""
        return {p.name[:-len(SWAP)]: p.stat().st_size for p in self.dir.glob("*" + SWAP)}


class MetaSwap:
    """The NVMe tier on meta tensors (``plan``, ``scale``): no data, so no file; each write and
    read is only booked by its caller, as a real one would be. Names its files as
    :class:`SwapDir` does, so the NVMe ledger counts one per unit and state."""

    def __init__(self, root, rank: int):
        self.dir = pathlib.Path(root or "<meta>") / f"rank{rank}"

    def path(self, name: str) -> pathlib.Path:
        return self.dir / (name + SWAP)

    def write(self, name: str, t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    def read(self, name: str, out: torch.Tensor) -> int:
        return out.numel() * out.element_size()

    def commit(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def on_disk(self) -> dict[str, int]:
        return {}
