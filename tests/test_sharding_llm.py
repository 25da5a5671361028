"""SmolLM2 on device meshes: tensor parallel over tp, data parallel over dp, on 8 CPU devices and on
two processes (jax.distributed on localhost), against the single-device tokens; Orbax checkpoints
of a sharded model restored onto other meshes."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from maxjax._bundled import smollm2_gguf_path
from maxjax.engine.mesh import make_mesh
from maxjax.graph.weights import GGUFWeights, restore_state, save_state
from maxjax.models import load_model
from net_util import free_port

PROMPT = "The quick brown fox"
NEW = 6


@functools.lru_cache(maxsize=None)
def _lm(dp: int = 1, tp: int = 1):
    return load_model() if dp * tp == 1 else load_model(mesh=make_mesh({"dp": dp, "tp": tp}))


@functools.lru_cache(maxsize=None)
def _reference() -> tuple[list[int], str]:
    [out] = _lm().generate([PROMPT], NEW)
    return out.token_ids, out.text


@pytest.mark.parametrize("dp,tp", [(1, 2), (1, 3), (1, 4), (2, 4), (8, 1)])
def test_greedy_tokens_on_a_mesh_are_the_single_device_tokens(dp, tp):
    lm = _lm(dp, tp)
    [out] = lm.generate([PROMPT], NEW)
    assert out.token_ids == _reference()[0]
    q = lm.state["stacked"][0]["self_attn.q_proj.weight"]
    leaf = q.values if hasattr(q, "values") else q.data
    assert leaf.sharding.spec == (P(None, "tp", None) if tp > 1 else P(None, None, None))
    kv = lm.module.kv_cache_heads  # 3 KV heads: padded to whole groups per device when tp does not divide them
    assert kv == (3 if tp in (1, 3) else 4)
    k_cache, _ = lm.new_cache(dp, 128)
    assert k_cache.shape[2] == kv and k_cache.sharding.spec == P(None, "dp", "tp" if tp > 1 else None, None, None)
    if tp > 1:  # each device holds its share of a quantized weight: 1/tp of the padded rows
        shard = leaf.addressable_shards[0].data
        assert shard.shape[1] * tp == leaf.shape[1]


def test_two_rows_on_two_data_parallel_devices_match_one_device():
    prompts = [PROMPT, "Once upon a time"]
    one = [g.token_ids for g in _lm().generate(prompts, NEW)]
    assert [g.token_ids for g in _lm(2, 4).generate(prompts, NEW)] == one


def test_sharded_checkpoint_restores_onto_another_mesh_and_onto_one_device(tmp_path):
    src = _lm(1, 4).module
    path = save_state(tmp_path / "tp4", src)  # the declared layout, sharded where it divides
    expected = {k: np.asarray(v) for k, v in src.state_dict().items()}
    for dst in (_lm(1, 2).module, _lm().module):
        restored = restore_state(path, dst)  # onto dst's storage shardings
        q = restored["layers.0.self_attn.q_proj.weight"]
        if dst is _lm(1, 2).module:
            assert q.sharding.spec == P("tp", None)
        for k, v in expected.items():
            np.testing.assert_array_equal(np.asarray(restored[k]), v, err_msg=k)


def _cli(*args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "maxjax.cli", "generate", "--no-progress", *args], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})}, **kw,
    )  # fmt: skip


def test_two_processes_share_a_mesh_and_each_reads_only_its_shards():
    """2 processes x 4 CPU devices, one global mesh with tp across the processes (tp=4,dp=2: the first
    axis spans processes): both print the single-process text, each reading about half the weights."""
    port = free_port()
    common = ["--cpu-devices", "4", "--mesh", "tp=4,dp=2", "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
              "--max-new-tokens", str(NEW), PROMPT]  # fmt: skip
    procs = [_cli(*common, "--process-id", str(i)) for i in range(2)]
    results = []
    deadline = time.monotonic() + 400
    for p in procs:
        try:
            results.append(p.communicate(timeout=max(1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the two processes did not finish in 400 s")
    infos = GGUFWeights(smollm2_gguf_path()).reader.tensors
    total = sum(int(t.n_bytes) for t in infos)
    norms = sum(int(t.n_bytes) for t in infos if t.name.endswith("norm.weight"))
    share = (total - norms) / 2 + norms  # each process holds tp shards {0, 1} or {2, 3}, and every norm
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err[-2000:]
        assert out.strip() == _reference()[1].strip()
        read = float(re.search(r"this process read ([0-9.]+) MB of weights", err).group(1)) * 1e6
        assert 0.4 * total < read <= 1.1 * share, (read, share, total)


def test_an_unreachable_coordinator_is_a_clear_error_within_its_timeout():
    port = free_port()
    t0 = time.monotonic()
    p = _cli("--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", "1", "hi",
             env={"MAXJAX_COORDINATOR_TIMEOUT": "5"})  # fmt: skip
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("maxjax generate: error:")]
    assert lines and f"could not join the run at coordinator 127.0.0.1:{port} within 5 s" in lines[0]
    assert time.monotonic() - t0 < 90


@pytest.mark.parametrize(
    "args,message",
    [
        (["--mesh", "dp=2,tp"], "mesh spec 'dp=2,tp': 'tp' is not axis=size"),
        (["--mesh", "dp=2,tp=4", "--cpu-devices", "2"], "mesh dp=2, tp=4 needs 8 devices, but only 2 are present"),
        (["--mesh", "ep=2", "--cpu-devices", "2"], "mesh axes ['ep'] are neither the data-parallel axis 'dp' nor"),
        (["--num-processes", "2"], "--num-processes needs --coordinator HOST:PORT"),
        (["--coordinator", "localhost", "--num-processes", "2"], "--coordinator 'localhost': expected HOST:PORT"),
    ],
)
def test_mesh_arguments_errors_are_one_line(args, message):
    p = _cli(*args, "hi")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1 and "Traceback" not in err
    assert err.strip().count("\n") == 0 and message in err, err


def test_inspect_shows_each_weights_partition_spec_and_bytes_per_device(capsys):
    import json

    from maxjax.cli import main

    assert main(["inspect", "--json", "--mesh", "dp=2,tp=4", "--quantized-layout", "nibbles", str(smollm2_gguf_path())]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in report["weights"]}
    assert report["mesh"] == {"dp": 2, "tp": 4} and len(rows) == 272
    q = rows["layers.0.self_attn.q_proj.weight"]  # 9 heads in 3 KV groups over 4 devices: padded to 4 groups
    assert q["spec"] == ["tp", None] and q["runtime_shape"] == [768, 576] and q["layout"] == "nibbles"
    assert q["bytes_per_device"] * 4 == q["bytes"] == 768 * 576 // 32 * 20  # Q4_1 nibbles: the file's bytes
    assert rows["norm.weight"]["spec"] == [None] and rows["norm.weight"]["bytes_per_device"] == 576 * 4
    assert rows["layers.3.mlp.down_proj.weight"]["spec"] == [None, "tp"]


@pytest.mark.parametrize("dp,tp", [(1, 2), (2, 2)])
def test_the_serving_engine_runs_a_sharded_model(dp, tp):
    """maxjax serve --mesh dp=..,tp=..: the engine's programs on a model split over tp, with the
    cache's rows split over dp, give the single-device tokens, with nothing compiled after warm-up."""
    from maxjax.serve import Engine, SamplingParams

    lm = _lm(dp, tp)
    ids = lm.encode_prompt(PROMPT)
    with Engine(lm, max_batch=3, max_context=64) as engine:
        assert engine.buckets.batch == ((1, 2, 3) if dp == 1 else (2, 4))  # rows in multiples of dp
        spec = engine.steps.cache_sharding.spec
        assert spec[2] == "tp" and (dp == 1 or spec[1] == "dp")  # heads over tp, rows over dp
        assert engine.steps.row_sharding.spec[1] is None  # a prefilled prompt's one row is not split
        n = engine.max_batch + 1  # more requests than rows: some wait for a row to free
        reqs = [engine.submit(ids, SamplingParams(max_tokens=NEW)) for _ in range(n)]
        results = [r.result(300) for r in reqs]
        assert engine.compiles_while_serving == 0
    assert all(r.token_ids[:NEW] == _reference()[0] for r in results)
