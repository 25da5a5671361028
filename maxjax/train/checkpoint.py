"""Orbax checkpoints of a training run: resume to the identical next step.

    ckpt = RunCheckpointer("runs/smollm2-lora", trainer, max_to_keep=3)
    state, position = ckpt.restore_or(trainer.init(seed=0))        # the latest checkpoint, or the start
    for position, tokens in stream.batches(4, 128, seed=0, start=position):
        state, metrics = trainer.step(state, tokens)
        if int(state.step) % 50 == 0:
            ckpt.save(state, data_position=position + 1)
    ckpt.close()

A checkpoint (an ``orbax.checkpoint.CheckpointManager`` step directory) holds the
:class:`~maxjax.train.trainer.TrainState` (trainable weights, optimizer state, step, RNG key as
its raw key data) and a JSON item: the data position (the next batch to read), the trainable
weights' names, shapes and dtypes, the LoRA rank, and a fingerprint of the frozen weights (their
names, shapes and a hash of their first values). Restoring checks that item against the trainer
first and refuses a checkpoint of another model, of another LoRA rank or with other trainable
weights, with one line naming what differs; the state passed in is never changed.

Writes are Orbax's: a step is written to a temporary directory and renamed into place when
complete, so a process killed mid-save leaves the previous checkpoints readable (the partial
directory is ignored, and removed by the next manager on that folder).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.train.lora import lora_rank
from maxjax.train.trainer import Trainer, TrainState

__all__ = ["RunCheckpointer", "CheckpointMismatchError", "run_fingerprint"]

FORMAT = "maxjax-train-run/1"


class CheckpointMismatchError(ValueError):
    """A checkpoint of another model, LoRA rank or trainable set (a ``ValueError``)."""


def _ocp() -> Any:
    import orbax.checkpoint as ocp  # slow to import: only when used

    return ocp


def _describe(x: Any) -> list[Any]:
    return [list(int(d) for d in x.shape), str(np.dtype(x.dtype))]


def run_fingerprint(trainer: Trainer) -> dict[str, Any]:
    """What a checkpoint must agree with to resume ``trainer``'s run (see the module docstring)."""
    frozen = hashlib.sha256()
    values = trainer.module.state_dict(auto_initialize=False)
    weights = trainer.module.raw_state_dict()
    trainable = set(trainer.trainable_names)
    for name in sorted(values):
        if name in trainable:
            continue
        for leaf in jax.tree.leaves(weights[name].as_value(values[name])):  # a quantized value: its leaves
            arr = np.asarray(leaf)
            frozen.update(f"{name}:{arr.shape}:{arr.dtype};".encode())
            frozen.update(np.ascontiguousarray(arr.reshape(-1)[:64]).tobytes())
    return {
        "format": FORMAT,
        "model": type(trainer.module).__name__,
        "lora_rank": lora_rank(trainer.module),
        "trainable": {e: _describe(v) for e, v in trainer._initial.items()},
        "frozen": frozen.hexdigest(),
    }


def _rank(rank: Any) -> str:
    return "no LoRA adapters" if rank is None else f"LoRA rank {rank}"


def _mismatch(where: str, saved: dict[str, Any], here: dict[str, Any]) -> str | None:
    if saved.get("format") != FORMAT:
        return f"{where} is not a maxjax training checkpoint (format {saved.get('format')!r})"
    if saved.get("model") != here["model"]:
        return f"{where} is of another model ({saved.get('model')}, this run trains a {here['model']})"
    if saved.get("lora_rank") != here["lora_rank"]:
        return f"{where} has {_rank(saved.get('lora_rank'))}; this model has {_rank(here['lora_rank'])}"
    st, ht = saved.get("trainable", {}), here["trainable"]
    for name in ht:
        if name not in st:
            return f"{where} has no trainable weight {name!r} (another model or trainable set)"
        if st[name] != ht[name]:
            return f"{where}: trainable weight {name!r} is {st[name][1]}{tuple(st[name][0])} there, {ht[name][1]}{tuple(ht[name][0])} here"
    for name in st:
        if name not in ht:
            return f"{where} trains weight {name!r}, which this run does not (another model or trainable set)"
    if saved.get("frozen") != here["frozen"]:
        return f"{where} was trained on other frozen weights (another base model)"
    return None


class RunCheckpointer:
    """Saves and restores a run of ``trainer`` under ``directory`` (see the module docstring).

    Args:
        directory: the run's folder (created if missing).
        trainer: the :class:`~maxjax.train.trainer.Trainer` whose states are saved.
        max_to_keep: how many recent checkpoints to keep (None: all).
        async_save: write in a background thread (``save`` returns once the arrays are copied;
            :meth:`wait` or :meth:`close` waits for the write).

    Raises:
        CheckpointMismatchError: ``directory`` already holds checkpoints of another model, LoRA
            rank or trainable set (nothing in it is changed).
    """

    def __init__(self, directory: str | os.PathLike[str], trainer: Trainer, *, max_to_keep: int | None = 3, async_save: bool = True):
        ocp = _ocp()
        self.directory = os.path.abspath(os.fspath(directory))
        self.trainer = trainer
        self.fingerprint = run_fingerprint(trainer)
        if os.path.isdir(self.directory):  # check before the manager touches the folder
            steps = self._finished_steps()
            if steps:
                self._check(max(steps))
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "run"))

    def _finished_steps(self) -> list[int]:
        out = []
        for name in os.listdir(self.directory):
            full = os.path.join(self.directory, name)
            if name.isdigit() and os.path.isdir(full) and os.path.exists(os.path.join(full, "run")):
                out.append(int(name))
        return out

    def _read_run(self, step: int) -> dict[str, Any]:
        import json

        path = os.path.join(self.directory, str(step), "run", "metadata")
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            raise CheckpointMismatchError(f"checkpoint {os.path.join(self.directory, str(step))}: unreadable run metadata ({e})") from None

    def _check(self, step: int) -> dict[str, Any]:
        run = self._read_run(step)
        problem = _mismatch(f"checkpoint {os.path.join(self.directory, str(step))}", run, self.fingerprint)
        if problem is not None:
            raise CheckpointMismatchError(problem)
        return run

    @staticmethod
    def _to_saveable(state: TrainState) -> dict[str, Any]:
        return {"params": state.params, "opt_state": state.opt_state, "step": state.step, "rng": jax.random.key_data(state.rng)}

    def save(self, state: TrainState, *, data_position: int, force: bool = False) -> bool:
        """Saves ``state`` as step ``int(state.step)``, with ``data_position`` (the next batch to read).

        Returns whether a checkpoint was written (False when that step already exists).
        """
        ocp = _ocp()
        step = int(state.step)
        if step in self.manager.all_steps():
            return False
        run = {**self.fingerprint, "step": step, "data_position": int(data_position),
               "rng_impl": str(jax.random.key_impl(state.rng))}  # fmt: skip
        args = ocp.args.Composite(state=ocp.args.StandardSave(self._to_saveable(state)), run=ocp.args.JsonSave(run))
        return bool(self.manager.save(step, args=args, force=force))

    def wait(self) -> None:
        """Waits until every save has been written."""
        self.manager.wait_until_finished()

    def latest_step(self) -> int | None:
        """The latest complete checkpoint's step, or None."""
        return self.manager.latest_step()

    def restore(self, template: TrainState, step: int | None = None) -> tuple[TrainState, int]:
        """``(state, data_position)`` of checkpoint ``step`` (default: the latest).

        ``template`` (e.g. ``trainer.init()``) gives the structure, shapes and devices; it is not
        changed.

        Raises:
            FileNotFoundError: no checkpoint (or not that step).
            CheckpointMismatchError: a checkpoint of another model, LoRA rank or trainable set.
        """
        ocp = _ocp()
        if step is None:
            step = self.manager.latest_step()
        if step is None or step not in self.manager.all_steps():
            raise FileNotFoundError(f"{self.directory}: no checkpoint{'' if step is None else f' of step {step}'}")
        run = self._check(step)
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), self._to_saveable(template)
        )
        restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
        impl = jax.random.key_impl(template.rng)
        rng = jax.random.wrap_key_data(jnp.asarray(restored["rng"]), impl=impl)
        state = TrainState(restored["params"], restored["opt_state"], restored["step"], rng)
        state = jax.device_put(state, jax.tree.map(lambda x: x.sharding, template))
        return state, int(run["data_position"])

    def restore_or(self, template: TrainState) -> tuple[TrainState, int]:
        """The latest checkpoint's ``(state, data_position)``, or ``(template, 0)`` when there is none."""
        if self.manager.latest_step() is None:
            return template, 0
        return self.restore(template)

    def close(self) -> None:
        """Waits for pending saves and releases the manager."""
        self.manager.wait_until_finished()
        self.manager.close()

    def __enter__(self) -> "RunCheckpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
