"""One FSDP2 training step under torch's ``FSDPMemTracker``, in one process: fake tensors
(``FakeTensorMode``) and the fake process group (``FakeStore``), torch's Adam (``foreach=False``).
The FSDPMemTracker tests (tests/engine/test_fsdp_memtracker.py, test_fsdp2_flavour_memtracker.py)
differ only in how they wrap the model and in the mixed-precision policy."""
from __future__ import annotations

import torch


def missing() -> str | None:
    """Why the tracker cannot run on this torch, or None."""
    try:
        import torch.distributed as dist
        if not dist.is_available():
            return "torch.distributed is not available in this build of torch"
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker  # noqa: F401
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: F401
        from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: F401
    except ImportError as exc:   # private modules: moved or absent in this torch version
        return f"torch {torch.__version__} lacks FSDPMemTracker, FSDP2 or the fake process group: {exc}"
    return None


def tracked_step(cfg, n: int, batch: int, wrap) -> dict[str, dict]:
    """The tracker's bytes per category on the CPU at the end of forward, backward and the step,
    at its peak up to the end of backward ("peak in backward") and over the step ("peak"); plus
    {"tensors": {"parameters": count}}. ``wrap(model, mesh)``, a module-level function, applies
    ``fully_shard``. Each step runs in a fresh process: the optimizer step's peak under the tracker
    depends on what ran before it in the process (a second tracked step there books it otherwise)."""
    import concurrent.futures
    import multiprocessing
    with concurrent.futures.ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_tracked_step, cfg, n, batch, wrap).result()


def _tracked_step(cfg, n: int, batch: int, wrap) -> dict[str, dict]:
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from zerospec.testing.oracles import GPT

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process")
    dist.init_process_group(backend="fake", rank=0, world_size=n, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (n,))   # outside fake mode: the mesh reads its rank map
        with FakeTensorMode():
            model = GPT.from_init(cfg, 0)
            wrap(model, mesh)
            optim = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
            idx = torch.zeros(batch, cfg.block_size, dtype=torch.long)
            targets = torch.zeros(batch, cfg.block_size, dtype=torch.long)
            tracker = FSDPMemTracker(model, optim)
            tracker.track_inputs((idx, targets))
            snaps = {}
            with tracker:
                loss = model(idx, targets)
                snaps["forward"] = tracker.get_tracker_snapshot("current")
                loss.backward()
                snaps["backward"] = tracker.get_tracker_snapshot("current")
                snaps["peak in backward"] = tracker.get_tracker_snapshot("peak")
                optim.step()
                snaps["step"] = tracker.get_tracker_snapshot("current")
            snaps["peak"] = tracker.get_tracker_snapshot("peak")
            n_tensors = len(list(model.parameters()))
    finally:
        dist.destroy_process_group()
    out = {at: {(c.value if hasattr(c, "value") else c): b for c, b in s[torch.device("cpu")].items()}
           for at, s in snaps.items()}
    out["tensors"] = {"parameters": n_tensors}
    return out


def ledger_phases(mem, phases=("forward", "backward", "step")) -> dict[str, dict[str, int]]:
    """zerospec's ledger ``mem`` (a traced meta step's rank) in the tracker's terms: bytes per
    category at the end of each phase, at the peak up to the end of backward ("peak in
    backward") and over the step ("peak"), each peak the breakdown when the total peaks — replayed
    from the ledger's allocation trace, as the tracker reports its peak."""
    out, now, live, top = {}, dict.fromkeys(mem.current, 0), {}, None
    for e in mem.trace:
        if e.op == "alloc":
            live[e.key] = (e.category, e.nbytes)
            now[e.category] += e.nbytes
            if top is None or sum(now.values()) > top["Total"]:
                top = dict(now) | {"Total": sum(now.values())}
        elif e.op == "free":
            category, nbytes = live.pop(e.key)
            now[category] -= nbytes
        elif e.label.split("@")[0] in phases:
            out[e.label.split("@")[0]] = dict(now) | {"Total": sum(now.values())}
            if e.label == "backward@1":
                out["peak in backward"] = dict(top)
    out["peak"] = top
    return out
