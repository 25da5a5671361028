"""Orbax checkpoints under faults: a save killed at any point, a flipped byte in a data file,
damaged metadata files; each gives the old or the new checkpoint whole, or one clean error."""

import glob
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from maxjax.graph.weights import OrbaxWeights, WeightsFileError, WeightsFormat, restore_state, save_state, weights_format

REPO = Path(__file__).resolve().parent.parent

STATE_SRC = """
import numpy as np

def make_state(seed):
    rng = np.random.default_rng(seed)
    state = {f"layers.{i}.weight": rng.standard_normal((96, 96)).astype(np.float32) for i in range(6)}
    state["step"] = np.array([seed], np.int32)
    return state
"""
exec(STATE_SRC)  # defines make_state, the same in this process and in the killed one

CHILD_SRC = STATE_SRC + """
import os, shutil, signal, sys

path, seed, kill = sys.argv[1], int(sys.argv[2]), sys.argv[3]
real_rename, real_rmtree = os.rename, shutil.rmtree
staged = []  # set once orbax has renamed the finished checkpoint to <path>.maxjax-new


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def rename(src, dst, *a, **k):
    is_staging = os.fspath(dst).endswith(".maxjax-new")
    if is_staging and kill == "before-staged":
        die()
    out = real_rename(src, dst, *a, **k)
    if is_staging:
        staged.append(True)
        if kill == "after-staged":
            die()
    elif staged and kill.startswith("after-rename-to:") and os.fspath(dst).endswith(kill.split(":", 1)[1]):
        die()
    return out


def rmtree(p, *a, **k):
    if staged and kill.startswith("rmtree:") and os.fspath(p).endswith(kill.split(":", 1)[1]):
        die()
    return real_rmtree(p, *a, **k)


os.rename, shutil.rmtree = rename, rmtree
import time
import orbax.checkpoint  # imported (slowly) before the save starts, so delays fall inside the save
from maxjax.graph.weights import save_state

state = make_state(seed)
print("ready", flush=True)
t0 = time.perf_counter()
save_state(path, state, overwrite=True)
print(f"saved in {time.perf_counter() - t0:.3f} s", flush=True)
"""


def _env():
    return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


def _same(restored, state):
    return set(restored) == set(state) and all(np.array_equal(np.asarray(restored[k]), v) for k, v in state.items())


def _save_and_kill(path, seed, kill, delay):
    """Runs a process that saves ``make_state(seed)`` over ``path``; it kills itself at ``kill`` (a
    rename or deletion of the save), or this process SIGKILLs it ``delay`` seconds into the save."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD_SRC, path, str(seed), kill], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env()
    )
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout.readline() == b"ready\n", proc.stderr.read()[-2000:]
        if delay is not None:
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


def test_a_save_killed_at_any_point_leaves_the_old_or_the_new_checkpoint(tmp_path):
    path = str(tmp_path / "ck")
    save_state(path, make_state(0))
    current = 0
    rng = random.Random(17)
    # (kill point, what restore must give): the renames and the deletion that make the swap, then
    # SIGKILLs after random delays while orbax writes
    trials = [
        ("before-staged", "old"),  # orbax has written everything but its final rename
        ("after-staged", "old"),  # the new checkpoint is complete beside the old one
        ("after-rename-to:.maxjax-old", "new"),  # the old one is moved aside, the new one not yet in place
        ("after-rename-to:/ck", "new"),  # swapped, the old one not yet deleted
        ("rmtree:.maxjax-old", "new"),
    ] + [(f"delay:{rng.uniform(0.0, 0.15):.3f}", "either") for _ in range(5)]
    seen = []
    for seed, (kill, want) in enumerate(trials, start=1):
        delay = float(kill.split(":")[1]) if kill.startswith("delay:") else None
        code, out, err = _save_and_kill(path, seed, kill, delay)
        assert code == -signal.SIGKILL or (delay is not None and code == 0), (kill, code, err[-2000:])
        assert weights_format([path]) is WeightsFormat.orbax
        restored = restore_state(path)  # never an error
        got = "new" if _same(restored, make_state(seed)) else "old" if _same(restored, make_state(current)) else "neither"
        assert got != "neither", (kill, {k: np.asarray(v).ravel()[:3] for k, v in restored.items()})
        assert want in (got, "either"), (kill, got)
        weights = OrbaxWeights(path)
        np.testing.assert_array_equal(weights.step.data().to_numpy(), restored["step"])
        seen.append(got)
        current = seed if got == "new" else current
    print("outcomes", list(zip([k for k, _ in trials], seen)))
    # the next save completes or removes whatever the killed ones left beside the checkpoint
    save_state(path, make_state(99), overwrite=True)
    assert _same(restore_state(path), make_state(99))
    assert sorted(os.listdir(tmp_path)) == ["ck"], os.listdir(tmp_path)


def test_save_refuses_to_overwrite_a_checkpoint_left_mid_swap(tmp_path):
    path = str(tmp_path / "ck")
    save_state(path, make_state(1))
    os.rename(path, path + ".maxjax-old")
    save_state(path + ".maxjax-new", make_state(2))  # as a save killed between its two renames leaves them
    assert _same(restore_state(path), make_state(2))
    with pytest.raises(ValueError, match="already exists"):
        save_state(path, make_state(3))
    assert sorted(os.listdir(tmp_path)) == ["ck"]  # the new checkpoint was put in place
    assert _same(restore_state(path), make_state(2))


def _largest_data_file(path):
    files = [f for f in glob.glob(os.path.join(path, "**", "*"), recursive=True) if os.path.isfile(f)]
    return max(files, key=os.path.getsize)


def test_a_flipped_byte_in_a_data_file_is_an_error_naming_the_array(tmp_path):
    state = {"big": np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32), "small": np.arange(4, dtype=np.int32)}
    path = save_state(tmp_path / "ck", state)
    data = _largest_data_file(path)
    raw = bytearray(Path(data).read_bytes())
    raw[len(raw) // 2] ^= 0x01
    Path(data).write_bytes(bytes(raw))
    pattern = rf"^{path}: array 'big' does not match its checksum \(SHA-256 [0-9a-f]{{16}}\.\.\., recorded [0-9a-f]{{16}}\.\.\.\): the checkpoint's data is damaged$"
    with pytest.raises(WeightsFileError, match=pattern):
        restore_state(path)
    weights = OrbaxWeights(path)
    with pytest.raises(WeightsFileError, match=pattern):
        weights.big.data()
    with pytest.raises(WeightsFileError, match=pattern):
        weights.restore_all()
    np.testing.assert_array_equal(weights.small.data().to_numpy(), state["small"])  # the others still load


@pytest.mark.parametrize(
    "file,content,message",
    [
        ("_METADATA", b"{not json", r"/_METADATA: damaged orbax tree metadata: not valid JSON \(Expecting property name"),
        ("_METADATA", b"[]", r"/_METADATA: damaged orbax tree metadata: unexpected structure \(AttributeError: "),
        ("_CHECKPOINT_METADATA", b"", r"/_CHECKPOINT_METADATA: damaged orbax step metadata: not valid JSON \(Expecting value"),
        ("manifest.ocdbt", b"xx", r"ck: damaged orbax checkpoint: cannot read its arrays' metadata: ValueError: DATA_LOSS: .*manifest\.ocdbt"),
        ("array_metadatas/process_0", b"{", r"/array_metadatas/process_0: damaged orbax array metadata: not valid JSON"),
    ],
)
def test_damaged_metadata_says_which_file_and_what_is_wrong(tmp_path, file, content, message):
    path = save_state(tmp_path / "ck", {"w": np.ones((2, 3), np.float32)})
    Path(path, file).write_bytes(content)
    for load in (restore_state, OrbaxWeights):
        with pytest.raises(WeightsFileError, match=message) as info:
            load(path)
        assert "\n" not in str(info.value)


def test_damaged_checkpoints_print_nothing(tmp_path):
    """No absl log lines and no 'Event loop is closed' tracebacks (which orbax's closed event loops
    used to give at random moments after a failed read) from many failed reads in one process."""
    good = save_state(tmp_path / "good", {f"w{i}": np.ones((8, 8), np.float32) * i for i in range(6)})
    bad_manifest, bad_json = str(tmp_path / "m"), str(tmp_path / "j")
    for bad in (bad_manifest, bad_json):
        subprocess.run(["cp", "-r", good, bad], check=True)
    Path(bad_manifest, "manifest.ocdbt").write_bytes(b"\x00" * 64)
    Path(bad_json, "_CHECKPOINT_METADATA").write_bytes(b"{")
    code = f"""
from maxjax.graph.weights import OrbaxWeights, restore_state
for i in range(60):
    for p in ({bad_manifest!r}, {bad_json!r}):
        try:
            restore_state(p)
        except ValueError:
            pass
import gc, time
gc.collect()
time.sleep(0.5)
print("done")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=_env())
    assert proc.returncode == 0 and proc.stdout == "done\n", proc.stderr[-3000:]
    assert proc.stderr == "", proc.stderr[-3000:]


def test_custom_metadata_keeps_encodings_and_checksums(tmp_path):
    path = save_state(tmp_path / "ck", {"a": np.arange(6, dtype=np.float32)})
    meta = json.loads(Path(path, "_CHECKPOINT_METADATA").read_text())["custom_metadata"]["maxjax"]
    import hashlib

    assert meta["sha256"] == {"a": hashlib.sha256(np.arange(6, dtype=np.float32).tobytes()).hexdigest()}
    assert meta["quantization"] == {}
