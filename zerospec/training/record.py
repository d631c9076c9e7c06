"""A run as plain data (``zerospec train --format json``): what two runs are compared by, bit for bit,
from the shell.

Losses are written as exact floats (``float.hex``: every bit of the fp64 mean), and the final fp32
master weights as one sha256 over every tensor in sorted name order (name, shape and the
tensor's little-endian bytes), so two runs agree in the digest exactly when every master weight
is ``torch.equal``. The ledgers' totals are integers. On meta tensors there are no values: the
losses and the digest are None.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math

import torch


def master_digest(master: dict[str, torch.Tensor]) -> str | None:
    """sha256 of the masters in sorted name order; None on meta (no values)."""
    h = hashlib.sha256()
    for name in sorted(master):
        t = master[name]
        if t.device.type == "meta":
            return None
        h.update(f"{name} {tuple(t.shape)} {t.dtype}\n".encode())
        h.update(t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _plain(x):
    """A config value as JSON data: dataclasses by field, tuples as lists, the rest by str."""
    if dataclasses.is_dataclass(x):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return str(x)


def record(result) -> dict:
    """The run ``result`` (training/result.Result) as JSON-ready data (see the module doc)."""
    cfg, comm = result.config, result.comm
    ranks = range(cfg.n_ranks)
    return {
        "config": _plain(cfg),
        "losses": [None if math.isnan(x) else float.hex(x) for x in result.losses],
        "master_sha256": master_digest(result.master),
        "ledgers": {
            "device_peak_bytes": [result.memory[r].peak_total for r in ranks],
            "model_states_bytes": [result.model_states(r) for r in ranks],
            "host_peak_bytes": [h.peak_total for h in result.host],
            "nvme_peak_bytes": [n.peak_total for n in result.nvme],
            "comm_records": [len(comm.records(r)) for r in ranks],
            "bytes_sent": [comm.bytes(r) for r in ranks],
            "host_link_bytes": [comm.link_bytes(r, group="host") for r in ranks],
        },
    }
