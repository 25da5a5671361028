"""``maxjax inspect``: tables (and JSON) for GGUF, safetensors and orbax; one-line errors."""

import json
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

from maxjax._bundled import minilm_dir, smollm2_gguf_path
from maxjax.cli import SUBCOMMANDS, main


def test_inspect_gguf_lists_metadata_and_every_tensor(capsys):
    assert main(["inspect", str(smollm2_gguf_path())]) == 0
    out = capsys.readouterr().out
    assert "gguf, 1 file(s), 272 tensors" in out
    assert "llama.attention.head_count_kv" in out and "<49152 x str>" in out
    assert "blk.29.ffn_down.weight" in out and "[576, 1536]" in out and "Q4_1" in out and "552,960" in out
    assert "token_embd.weight" in out and "Q8_0" in out and "30,081,024" in out
    assert "272 tensor(s) shown" in out


def test_inspect_json_of_a_safetensors_directory(capsys):
    assert main(["inspect", "--json", "--filter", r"^encoder\.layer\.0\.attention\.self", str(minilm_dir())]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == "safetensors" and report["metadata"] == {"format": "pt"}
    tensors = {t["name"]: t for t in report["tensors"]}
    assert len(tensors) == 6
    q = tensors["encoder.layer.0.attention.self.query.weight"]
    assert q == {"name": q["name"], "shape": [384, 384], "dtype": "float32", "encoding": None, "bytes": 384 * 384 * 4}


def test_inspect_orbax_checkpoint(tmp_path, capsys):
    from maxjax.graph.weights import save_state

    path = save_state(tmp_path / "ck", {"a.weight": np.ones((2, 3), np.float32)})
    assert main(["inspect", "--json", path]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == "orbax"
    assert report["tensors"] == [{"name": "a.weight", "shape": [2, 3], "dtype": "float32", "encoding": None, "bytes": 24}]


def test_inspect_several_paths(tmp_path, capsys):
    a = tmp_path / "a.safetensors"
    save_file({"x": np.zeros(3, np.int8)}, str(a))
    assert main(["inspect", "--no-metadata", str(a), str(a)]) == 0
    assert capsys.readouterr().out.count("1 tensor(s) shown") == 2


@pytest.mark.parametrize(
    "args,message",
    [
        (["inspect", "/no/such/file.gguf"], "maxjax inspect: error: /no/such/file.gguf: no such file or directory"),
        (["inspect", "--filter", "(", "x"], "maxjax inspect: error: --filter: invalid regular expression"),
    ],
)
def test_bad_input_gives_one_line_and_status_1(capsys, args, message):
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1 and "Traceback" not in err


def test_corrupted_file_through_the_installed_command(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    proc = subprocess.run([sys.executable, "-m", "maxjax.cli", "inspect", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"maxjax inspect: error: {bad}: not a valid safetensors file")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "file,content,message",
    [
        ("_METADATA", b"{not json", "_METADATA: damaged orbax tree metadata: not valid JSON"),
        ("manifest.ocdbt", b"\x00" * 64, "damaged orbax checkpoint: cannot read its arrays' metadata: ValueError: DATA_LOSS"),
    ],
)
def test_damaged_orbax_checkpoint_through_the_installed_command(tmp_path, file, content, message):
    from maxjax.graph.weights import save_state

    path = save_state(tmp_path / "ck", {f"w{i}": np.ones((4, 4), np.float32) for i in range(4)})
    (tmp_path / "ck" / file).write_bytes(content)
    proc = subprocess.run([sys.executable, "-m", "maxjax.cli", "inspect", path], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"maxjax inspect: error: {path}") and message in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr and "absl" not in proc.stderr


def test_usage_errors_and_subcommand_registry(capsys):
    assert "inspect" in [c.name for c in SUBCOMMANDS]
    assert main([]) == 2
    with pytest.raises(SystemExit) as info:
        main(["inspect"])
    assert info.value.code == 2


def test_inspect_gives_the_memory_plan_of_a_model(capsys):
    import os

    from maxjax.backend import policy_for
    from maxjax.models.loading import memory_plan

    path = str(smollm2_gguf_path())
    assert main(["inspect", "--json", "--filter", "^$", path]) == 0
    plan = json.loads(capsys.readouterr().out)["memory_plan"]
    assert plan["file"] == os.path.getsize(path) and plan["layout"] == policy_for(None).quantized_layout
    # SmolLM2: 30 blocks, 3 KV heads of 64, float32 keys and values
    assert plan["kv_cache"] == 2 * 30 * 3 * 64 * plan["kv_tokens"] * 4
    assert plan["total"] == plan["weights"] + plan["kv_cache"] and plan["weights"] == memory_plan(path)["weights"]
    assert main(["inspect", "--no-metadata", "--filter", "^$", path]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"to run: weights {plan['weights'] / 1e6:.2f} MB in their run-time layout ({plan['layout']} for quantized tensors)" in out
    # a checkpoint that is not a model has no plan
    assert main(["inspect", "--json", str(minilm_dir() / "model.safetensors")]) == 0
    assert json.loads(capsys.readouterr().out)["memory_plan"] is None
