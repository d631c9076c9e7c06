"""Checkpoint files: resharding to any M, nothing lost on a crash, and clear errors, never a partial load."""
from __future__ import annotations

import json
import pathlib
import tempfile

import pytest
import torch
from hypothesis import strategies as st

from tests.support.examples import examples
from zerospec.training import checkpoint
from zerospec.training.checkpoint import CheckpointError, TrainState
from zerospec.runtime.errors import RankError
from zerospec.optim.loss_scale import LossScale
from zerospec.model.gpt import ODD, SMALL
from zerospec.model.units import make_units
from zerospec.training.config import TrainConfig
from zerospec.training.run import train

META = {"step": 3, "optim_step": 3, "stage": 2, "n_ranks": 1, "precision": "fp16", "scaler": None,
        "data": {"seed": 0, "global_batch": 8}}
SHAPES = st.lists(st.tuples(st.integers(1, 7), st.integers(1, 5)), min_size=1, max_size=3)


def _state(spec, seed: int = 0) -> TrainState:
    g = torch.Generator().manual_seed(seed)
    units = make_units(spec, 1, pad=False)
    tensors = {k: [torch.randn(u.numel, generator=g).to(torch.float16 if k == "param16" else torch.float32)
                   for u in units] for k in checkpoint.KINDS}
    return TrainState(spec, tensors, dict(META))


def _reshards_without_loss(units, n, m):
    """Any unit sizes, any N → M: every tensor comes back bit for bit; each rank's M-shard is its
    chunk of the re-padded unit, padding zero; and M → N again gives the original files' state."""
    spec = [(f"u{i}", [(f"p{j}", shape) for j, shape in enumerate(params)]) for i, params in enumerate(units)]
    st0 = _state(spec)
    with tempfile.TemporaryDirectory() as d:
        checkpoint.save_state(st0, pathlib.Path(d) / "a", n)
        ck = checkpoint.load(pathlib.Path(d) / "a", n_ranks=m)
        for k in checkpoint.KINDS:
            assert all(torch.equal(a, b) for a, b in zip(ck.tensors[k], st0.tensors[k]))
        shards = [ck.shard(r) for r in range(m)]
        for i, u in enumerate(ck.units(m)):
            for k in checkpoint.KINDS:
                full = torch.cat([shards[r][i][k] for r in range(m)])
                assert full.numel() == u.padded and full.numel() % m == 0
                assert torch.equal(full[:u.numel], st0.tensors[k][i]) and not full[u.numel:].any()
        checkpoint.save_state(ck, pathlib.Path(d) / "b", m)
        back = checkpoint.load(pathlib.Path(d) / "b", n_ranks=n)
        assert all(torch.equal(a, b) for k in checkpoint.KINDS for a, b in zip(back.tensors[k], st0.tensors[k]))


test_saving_at_n_and_loading_at_m_reshards_without_loss, \
    test_saving_at_n_and_loading_at_m_reshards_without_loss_more_examples = \
    examples(10, 40, units=st.lists(SHAPES, min_size=1, max_size=4), n=st.integers(1, 9),
             m=st.integers(1, 9))(_reshards_without_loss)


@pytest.fixture
def saved(tmp_path) -> pathlib.Path:
    spec = [(n, [(p, tuple(s)) for p, s in ps]) for n, ps in ODD.unit_spec()]
    path = tmp_path / "ck"
    checkpoint.save_state(_state(spec), path, 4)
    return path


def _corrupt(path: pathlib.Path, how: str) -> None:
    f = path / "rank-00002.pt"
    if how == "missing":
        f.unlink()
    elif how == "truncated":
        f.write_bytes(f.read_bytes()[:100])
    elif how == "flipped":
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    elif how == "no manifest":
        (path / "manifest.json").unlink()
    elif how == "manifest truncated":
        m = path / "manifest.json"
        m.write_bytes(m.read_bytes()[:50])
    elif how == "shard dropped from manifest":
        m = json.loads((path / "manifest.json").read_text())
        m["files"] = [e for e in m["files"] if e["rank"] != 2]
        (path / "manifest.json").write_text(json.dumps(m))


DAMAGE = {  # how the checkpoint is damaged → what the error must say
    "missing": r"shard rank-00002.pt \(rank 2\) is missing",
    "truncated": r"shard rank-00002.pt \(rank 2\) has 100 bytes, the manifest says \d+ \(truncated",
    "flipped": r"shard rank-00002.pt \(rank 2\) fails its sha256 check \(corrupt\)",
    "no manifest": r"manifest.json is missing: not a checkpoint, or a save that never finished",
    "manifest truncated": r"manifest.json is not valid JSON \(truncated or corrupt\?\)",
    "shard dropped from manifest": r"unit 'embed': elements \[\d+, \d+\) are in no shard",
}


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_checkpoint_is_refused_naming_what_is_wrong(saved, how):
    """Missing, truncated or corrupt files, incomplete manifests: CheckpointError, never a partial load."""
    _corrupt(saved, how)
    with pytest.raises(CheckpointError, match=DAMAGE[how]):
        checkpoint.load(saved, n_ranks=2)


def test_a_checkpoint_of_another_model_is_refused_naming_the_unit_and_shapes(saved):
    """Loading an ODD checkpoint for SMALL names the first differing parameter and both shapes."""
    with pytest.raises(CheckpointError, match=r"model mismatch in unit 'embed'.*"
                                              r"wte \(37, 15\) vs wte \(1024, 128\)"):
        checkpoint.load(saved, model=SMALL)


def test_saving_onto_an_existing_checkpoint_is_refused(saved):
    """Checkpoints are written once: a second save to the same directory raises FileExistsError."""
    with pytest.raises(FileExistsError, match="already exists; checkpoints are written once"):
        checkpoint.save_state(checkpoint.load(saved), saved, 2)


def test_a_save_that_crashes_part_way_leaves_the_previous_checkpoint_loadable(tmp_path, monkeypatch):
    """Crash after 2 of the step-2 files: step-1's checkpoint loads intact; step-2 does not exist."""
    written = []
    real = checkpoint.write_file

    def flaky(path, data):
        if path.parent.name == ".step-2.partial" and len(written) == 2:
            raise OSError("disk full (simulated)")
        if path.parent.name == ".step-2.partial":
            written.append(path.name)
        real(path, data)
    monkeypatch.setattr(checkpoint, "write_file", flaky)
    cfg = TrainConfig(stage=3, n_d=4, model=ODD, steps=3)
    with pytest.raises(RankError, match="disk full"):
        train(cfg, save={1: tmp_path / "step-1", 2: tmp_path / "step-2"})
    ref = train(TrainConfig(stage=3, n_d=4, model=ODD, steps=1), keep_state=True).state()
    ck = checkpoint.load(tmp_path / "step-1")
    assert all(torch.equal(a, b) for k in checkpoint.KINDS for a, b in zip(ck.tensors[k], ref.tensors[k]))
    assert not (tmp_path / "step-2").exists()
    with pytest.raises(CheckpointError, match=r"no such checkpoint directory \(an unfinished save left "
                                              r"\.step-2\.partial"):
        checkpoint.load(tmp_path / "step-2")
    monkeypatch.setattr(checkpoint, "write_file", real)          # the retry succeeds
    train(cfg, save={2: tmp_path / "step-2"})
    assert checkpoint.load(tmp_path / "step-2").step == 2 and not (tmp_path / ".step-2.partial").exists()


@pytest.mark.parametrize("change,match", [
    pytest.param({"n_d": 2}, r"checkpoint was loaded for n_ranks=4 but the config has n_d=2", id="ranks"),
    pytest.param({"global_batch": 16}, r"continues data stream \{'seed': 0, 'global_batch': 8\}.*"
                 r"global_batch': 16", id="data"),
    pytest.param({"precision": "bf16"}, r"checkpoint holds fp16 training state; the config asks for "
                 r"precision='bf16'", id="precision"),
    pytest.param({"loss_scale": LossScale()}, r"loss-scaler state None but the config has loss_scale=",
                 id="scaler"),
    pytest.param({"steps": 2}, r"the checkpoint is at step 2; cfg.steps=2 leaves nothing to run", id="steps"),
])
def test_a_resume_that_would_change_the_run_is_refused(tmp_path, change, match):
    """Ranks as loaded, the same data, precision and scaling, steps left: else ValueError naming both sides."""
    train(TrainConfig(stage=1, n_d=4, model=ODD, steps=2), save={2: tmp_path / "c"})
    ck = checkpoint.load(tmp_path / "c", n_ranks=4)
    kw = {"stage": 1, "n_d": 4, "model": ODD, "steps": 4, "global_batch": 8, **change}
    with pytest.raises(ValueError, match=match):
        train(TrainConfig.of(**kw), resume=ck)
