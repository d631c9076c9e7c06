"""``"auto"`` in a DeepSpeed config, filled as transformers' Trainer fills it
(transformers/integrations/deepspeed.py, ``HfTrainerDeepSpeedConfig``): ``trainer_config_process``
takes the batch keys from TrainingArguments (per_device_train_batch_size, gradient_accumulation_steps,
world_size) and fp16/bf16 ``enabled`` from its fp16/bf16 flags; ``trainer_config_finalize`` the
bucket sizes from the model's hidden size. zerospec/plan/ds_config.py keeps what it cannot fill
yet; :func:`resolve` fills it once the model and the micro-batch are known. Torch-free."""
from __future__ import annotations

import dataclasses

# "auto" keys transformers fills from the model's hidden size h (HfTrainerDeepSpeedConfig.
# trainer_config_finalize): h·h, and at stage 3 only int(0.9·h·h) and 10·h
HIDDEN_AUTO = {"reduce_bucket_size": lambda h: h * h,
               "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
               "stage3_param_persistence_threshold": lambda h: 10 * h}


def resolve(ds, hidden_size: int | None = None, micro_batch: int | None = None):
    """The "auto" values transformers' Trainer fills (integrations/deepspeed.py,
    HfTrainerDeepSpeedConfig): the micro-batch from per_device_train_batch_size
    (``micro_batch``), the bucket sizes from the model's ``hidden_size``. One left "auto"
    with nothing to fill it is refused, naming the flag that fills it."""
    kw, done = {}, list(ds.resolved)
    for key in sorted(ds.auto):
        short = key.rpartition(".")[2]
        if short in HIDDEN_AUTO:
            if hidden_size is None:
                raise ValueError(f"{ds.path!r}: {key} is \"auto\", which transformers fills "
                                 f"from the model's hidden_size; give --preset NAME (or --explain with "
                                 f"--hf-config CONFIG.JSON)")
            kw[short] = HIDDEN_AUTO[short](hidden_size)
            done.append((key, f"auto → {kw[short]:,} (transformers: from hidden_size "
                              f"{hidden_size:,})"))
        elif key == "train_micro_batch_size_per_gpu" and micro_batch is not None:
            kw[key] = micro_batch
            done.append((key, f"auto → {micro_batch} (transformers: "
                              f"per_device_train_batch_size, --micro-batch)"))
    left = ds.auto - {k for k in ds.auto if k.rpartition(".")[2] in kw}
    return dataclasses.replace(ds, auto=frozenset(left), resolved=tuple(done), **kw)


def autos(doc, where: str = ""):
    """Dotted keys of every "auto" value (optimizer, scheduler, ... included)."""
    for k, v in (doc.items() if isinstance(doc, dict) else ()):
        key = f"{where}.{k}" if where else k
        if v == "auto":
            yield key
        yield from autos(v, key)
