"""Orbax checkpoints of a run: the resumed run's losses equal the uninterrupted run's, a process killed
mid-save leaves the last good checkpoint readable, and checkpoints of another model or LoRA rank
are refused without changing anything (issue 15)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import optax
import pytest

from maxjax import train
from maxjax.train.checkpoint import CheckpointMismatchError, RunCheckpointer
from maxjax.train.data import TokenStream
from train_util import tiny_model

HERE = os.path.dirname(os.path.abspath(__file__))


def _lora_trainer(rank: int, seed: int = 0):
    model = tiny_model(seed)
    train.apply_lora(model, ["q_proj", "v_proj"], rank=rank, alpha=2 * rank, key=jax.random.key(1))
    return train.Trainer(model, optax.adamw(1e-2), trainable="*lora_*")


def _stream():
    return TokenStream(np.random.default_rng(0).integers(0, 61, 4000).astype(np.int32))


def test_a_resumed_run_takes_the_identical_next_steps(tmp_path):
    stream = _stream()
    trainer = _lora_trainer(4)
    state = trainer.init(seed=3)
    losses = []
    with RunCheckpointer(tmp_path / "run", trainer) as ckpt:
        for position, batch in stream.batches(4, 16, seed=5):
            state, m = trainer.step(state, batch)
            losses.append(float(m["loss"]))
            if position == 2:
                ckpt.save(state, data_position=position + 1)
            if position == 5:
                break
    # a new process would do this: a fresh trainer, restore, continue from the data position
    trainer2 = _lora_trainer(4)
    template = trainer2.init(seed=99)
    before = {k: np.asarray(v) for k, v in template.params.items()}
    with RunCheckpointer(tmp_path / "run", trainer2) as ckpt:
        assert ckpt.latest_step() == 3
        state2, position = ckpt.restore(template)
    assert position == 3 and int(state2.step) == 3
    for k, v in before.items():  # the template is untouched
        np.testing.assert_array_equal(np.asarray(template.params[k]), v)
    assert not np.array_equal(np.asarray(jax.random.key_data(state2.rng)), np.asarray(jax.random.key_data(template.rng)))
    resumed = []
    for pos, batch in stream.batches(4, 16, seed=5, start=position):
        state2, m = trainer2.step(state2, batch)
        resumed.append(float(m["loss"]))
        if pos == 5:
            break
    assert resumed == losses[3:]
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(state2.rng)), np.asarray(jax.random.key_data(state.rng)))


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {here!r})
    import jax, numpy as np
    import orbax.checkpoint._src.path.atomicity as atomicity
    from maxjax.train.checkpoint import RunCheckpointer
    from test_train_checkpoint import _lora_trainer, _stream

    trainer = _lora_trainer(4)
    state = trainer.init(seed=3)
    ckpt = RunCheckpointer({path!r}, trainer)
    stream = _stream()
    for position, batch in stream.batches(4, 16, seed=5):
        state, m = trainer.step(state, batch)
        if position == 1:
            ckpt.save(state, data_position=2)
            ckpt.wait()
            print("saved", int(state.step), float(m["loss"]), flush=True)
        if position == 3:
            break

    async def killed(self, *args, **kwargs):  # the write is complete, the commit (rename) not yet made
        print("killing", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    atomicity.AtomicRenameTemporaryPath.finalize = killed
    ckpt.save(state, data_position=4)
    ckpt.wait()
    print("not killed", flush=True)
    """
)


def test_a_process_killed_mid_save_leaves_the_last_good_checkpoint(tmp_path):
    path = str(tmp_path / "run")
    code = CHILD.format(here=HERE, path=path)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stdout + proc.stderr[-3000:]
    assert "saved 2" in proc.stdout and "killing" in proc.stdout and "not killed" not in proc.stdout
    leftovers = [n for n in os.listdir(path) if n not in ("2",)]
    assert leftovers and all("tmp" in n for n in leftovers)  # step 4 was written but never committed
    trainer = _lora_trainer(4)
    with RunCheckpointer(path, trainer) as ckpt:
        assert ckpt.latest_step() == 2
        state, position = ckpt.restore(trainer.init())
    assert position == 2 and int(state.step) == 2
    # the restored step continues exactly as in an uninterrupted run
    ref = trainer.init(seed=3)
    for pos, batch in _stream().batches(4, 16, seed=5):
        ref, m = trainer.step(ref, batch)
        if pos == 1:
            break
    for k in ref.params:
        np.testing.assert_array_equal(np.asarray(state.params[k]), np.asarray(ref.params[k]))


def _snapshot(path):
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            out[p] = (os.path.getsize(p), os.path.getmtime(p))
    return out


def test_checkpoints_of_another_lora_rank_or_model_are_refused_and_left_alone(tmp_path):
    path = tmp_path / "run"
    trainer = _lora_trainer(4)
    with RunCheckpointer(path, trainer) as ckpt:
        ckpt.save(trainer.init(), data_position=0)
    snap = _snapshot(path)
    with pytest.raises(CheckpointMismatchError, match=r"^checkpoint .*/run/0 has LoRA rank 4; this model has LoRA rank 8$"):
        RunCheckpointer(path, _lora_trainer(8))
    with pytest.raises(CheckpointMismatchError, match=r"^checkpoint .*/run/0 was trained on other frozen weights \(another base model\)$"):
        RunCheckpointer(path, _lora_trainer(4, seed=1))
    other = train.Trainer(tiny_model(0), optax.adamw(1e-2))
    with pytest.raises(CheckpointMismatchError, match=r"^checkpoint .*/run/0 has LoRA rank 4; this model has no LoRA adapters$"):
        RunCheckpointer(path, other)
    assert _snapshot(path) == snap
    with RunCheckpointer(tmp_path / "empty", trainer) as ckpt:
        with pytest.raises(FileNotFoundError, match="no checkpoint"):
            ckpt.restore(trainer.init())
        state, position = ckpt.restore_or(trainer.init())
        assert position == 0 and int(state.step) == 0
