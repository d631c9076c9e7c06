"""torchtitan as a peer: its own Llama 3 and its own ``parallelize_llama`` under torch's
``FSDPMemTracker``, on fake tensors and the fake process group, on the CPU — as torchtitan's
memory estimation script (``scripts/estimate/estimation.py``: ``estimate_memory``) runs it.

What is torchtitan's (``pip install torchtitan==0.3.0``, the ``titan`` extra): the model config
(``torchtitan/models/llama3/__init__.py``: ``llama3_configs``), the model it builds, the
parallelization (``torchtitan/models/llama3/parallelize.py``: ``parallelize_llama`` →
``torchtitan/distributed/fsdp.py``: ``apply_fsdp_to_decoder`` with
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, the training defaults of
``torchtitan/config/configs.py``), its per-op selective checkpointing
(``torchtitan/distributed/activation_checkpoint.py``: ``SelectiveAC``) and its loss
(``torchtitan/components/loss.py``: ``cross_entropy_loss``, fp32 upcast, sum). As the estimation
script: the model built on meta inside ``FakeTensorMode``, ``to_empty``, two training
iterations under the tracker (the first has no optimizer states); the tracker's peak over both is
the second's, which holds everything the first does and the optimizer states.

What is changed, each because the CPU build cannot run torchtitan's choice:

* the device is ``cpu``, not ``cuda`` (no CUDA in this torch; FSDP2 asks the device handle for
  its current device): ``ParallelDims`` builds its mesh on the device type
  ``torchtitan.tools.utils.device_type``, set to ``"cpu"`` here before the mesh is built;
* attention is torchtitan's ``ScaledDotProductAttention`` (causal, no masks), not its default
  compiled FlexAttention, whose backward has no CPU kernel (``flex_attention``:
  "FlexAttention does not support backward on CPU"); the input is one document per sequence,
  for which both compute causal attention;
* the ``spmd_backend`` is ``partial_dtensor`` (plain ``fully_shard`` on the FSDP mesh): with its
  default, ``spmd_types``, this setup stops in ``fully_shard`` ("When dp_mesh_dims is provided,
  all parameters must be DTensors on the full SPMD mesh");
* AdamW is torch's for-loop one (``foreach=False``), as the other tracker tests run it:
  torchtitan's default implementation, ``fused``, raises the tracker's optimizer-state peak far
  above the states under fake CPU tensors.

``tracked_step`` returns the tracker's bytes per category (``Sharded Param``, ``Activation``, …)
at the end of forward, backward and the step of the second iteration, its ``peak``, and the
counts the tests need to name terms (parameter tensors, the buffers' bytes: torchtitan's RoPE
caches), and the tracker's per-module reading: what each block's forward keeps.
"""
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class TitanRun:
    """One estimation: torchtitan's Llama 3 ``flavor`` at world size ``n``, local batch and
    sequence, activation checkpointing ``ac`` ("none" or "selective-op")."""
    flavor: str
    n: int
    batch: int
    seq: int
    ac: str = "none"


def missing() -> str | None:
    """Why torchtitan's peer cannot run here, or None."""
    try:
        import torch.distributed as dist
        if not dist.is_available():
            return "torch.distributed is not available in this build of torch"
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker  # noqa: F401
        from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: F401
    except ImportError as exc:
        return f"torch {torch.__version__} lacks FSDPMemTracker or the fake process group: {exc}"
    try:
        import torchtitan.models.llama3  # noqa: F401
    except ImportError as exc:   # the titan extra: pip install -e ".[titan]"
        return (f"torchtitan is not importable (pip install -e \".[titan]\" && pip install --no-deps "
                f"\"torchtitan==0.3.0\"): {exc}")
    return None


def config(flavor: str):
    """torchtitan's own config of Llama 3 ``flavor``, attention by its SDPA module."""
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import llama3_configs
    cfg = llama3_configs[flavor](attn_backend="flex")
    for layer in cfg.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return cfg


def tracked_step(run: TitanRun) -> dict[str, dict]:
    """The tracker's readings for ``run``, in a fresh spawned process (a process group and the
    tracker's optimizer hooks are process-wide)."""
    import concurrent.futures
    import multiprocessing
    with concurrent.futures.ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_tracked_step, run).result()


def _tracked_step(run: TitanRun) -> dict[str, dict]:
    import torch.distributed as dist
    import torchtitan.tools.utils as titan_utils
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import parallel_dims as titan_dims
    from torchtitan.distributed.activation_checkpoint import SelectiveAC
    from torchtitan.models.llama3 import parallelize_llama

    titan_utils.device_type = titan_dims.device_type = "cpu"
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process")
    dist.init_process_group("fake", rank=0, world_size=run.n, store=FakeStore())
    try:
        parallelism = ParallelismConfig(data_parallel_shard_degree=run.n,
                                        spmd_backend="partial_dtensor")
        dims = ParallelDims.from_config(parallelism, run.n)
        dims.world_mesh                     # built outside fake mode, as estimation.py does
        cfg = config(run.flavor)
        ac = {"none": None, "selective-op": SelectiveAC.Config()}[run.ac]
        with FakeTensorMode():
            with torch.device("meta"):
                model = cfg.build()
            parallelize_llama(model, parallel_dims=dims,
                              training=TrainingConfig(local_batch_size=run.batch, seq_len=run.seq),
                              parallelism=parallelism, compile_config=CompileConfig(),
                              ac_config=ac, dump_folder="")
            model.to_empty(device="cpu")
            model.train()
            optim = torch.optim.AdamW(model.parameters(), lr=8e-4, foreach=False)
            tokens = torch.randint(0, cfg.vocab_size, (run.batch, run.seq))
            labels = torch.randint(0, cfg.vocab_size, (run.batch, run.seq))
            tracker = FSDPMemTracker(mod=model, optm=optim)
            tracker.track_inputs((tokens, labels))
            snaps = {}
            with tracker:
                for _ in range(2):          # the second iteration has the optimizer states
                    pred = model(tokens)
                    loss = cross_entropy_loss(pred, labels)
                    del pred
                    snaps["forward"] = tracker.get_tracker_snapshot("current")
                    loss.backward()
                    snaps["backward"] = tracker.get_tracker_snapshot("current")
                    optim.step()
                    snaps["step"] = tracker.get_tracker_snapshot("current")
                    optim.zero_grad()
            snaps["peak"] = tracker.get_tracker_snapshot("peak")
            modules = _forward_growth(tracker)
            counts = {"parameters": len(list(model.parameters())),
                      "buffers": sum(b.numel() * b.element_size() for b in model.buffers())}
    finally:
        dist.destroy_process_group()
    out = {at: {(c.value if hasattr(c, "value") else c): b for c, b in s[torch.device("cpu")].items()}
           for at, s in snaps.items()}
    out["counts"] = counts
    out["modules"] = modules
    return out


def _forward_growth(tracker) -> dict[str, int]:
    """Per top-level module and block (``tok_embeddings``, ``layers.0``, …, ``norm``,
    ``lm_head``): how much its forward of the last iteration grew the tracker's Activation bytes,
    from after its pre-forward hooks to before its post-forward hooks — what it keeps for backward
    and its output."""
    out = {}
    for stats in tracker.memory_tracking.values():
        fqn = stats.mod_fqn.split(".", 1)[1] if "." in stats.mod_fqn else ""
        if not fqn or fqn.count(".") > 1 or fqn == "layers":
            continue
        snaps = {state.value: s[-1][torch.device("cpu")] for state, s in stats.snapshots.items()}
        out[fqn] = snaps["Before Post-Forward"]["Activation"] - snaps["After Pre-Forward"]["Activation"]
    return out
