"""``/v1/embeddings`` over real HTTP: one encoder server process on a free localhost port (all-MiniLM-L6-v2,
4 rows a pass, no warm-up), driven by the official ``openai`` client and ``httpx``, compared with
sentence-transformers' reference embeddings. Every wait is bounded; the last test stops the server
with SIGTERM."""

from __future__ import annotations

import concurrent.futures
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from maxjax._bundled import minilm_dir
from net_util import free_port

REF = np.load(Path(__file__).parent / "data" / "minilm_reference.npz")
SENTENCES = [str(s) for s in REF["sentences"]]
SHORT = [0, 1, 2, 3, 4, 13]  # 4 to 16 tokens: every pass is one [rows, 16] shape
NAME = "all-MiniLM-L6-v2"
START_TIMEOUT, WAIT = 240, 60


def _cos(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("serve_embeddings") / "server.log"
    argv = [
        sys.executable, "-m", "maxjax.cli", "serve", "--model", str(minilm_dir()), "--port", str(port),
        "--max-batch", "4", "--max-queue", "16", "--no-warmup", "--served-model-name", NAME, "--log-level", "warning",
    ]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"encoder server exited with {proc.returncode}:\n{log.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"encoder server did not answer /health within {START_TIMEOUT} s:\n{log.read_text()}")
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        yield proc, base
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[1] + "/v1", api_key="unused", timeout=WAIT, max_retries=0)


def test_openai_client_embeddings_match_sentence_transformers(client):
    texts = [SENTENCES[i] for i in SHORT]
    r = client.embeddings.create(model=NAME, input=texts)  # the client asks for base64 and decodes it
    assert [d.index for d in r.data] == list(range(len(texts))) and r.model == NAME
    assert _cos([d.embedding for d in r.data], REF["embeddings"][SHORT]).min() >= 0.99999
    assert r.usage.prompt_tokens == r.usage.total_tokens == int(REF["lengths"][SHORT].sum())
    one = client.embeddings.create(model=NAME, input=SENTENCES[2], encoding_format="float")
    assert len(one.data) == 1 and len(one.data[0].embedding) == 384
    np.testing.assert_allclose(one.data[0].embedding, r.data[2].embedding, atol=1e-6)
    ids = REF["input_ids"][2, 1 : REF["lengths"][2] - 1].tolist()  # the text's tokens without [CLS]/[SEP]
    by_ids = client.embeddings.create(model=NAME, input=ids, encoding_format="float")
    np.testing.assert_allclose(by_ids.data[0].embedding, one.data[0].embedding, atol=1e-6)
    two = client.embeddings.create(model=NAME, input=[ids, ids[:3]])
    assert len(two.data) == 2 and two.usage.prompt_tokens == len(ids) + 2 + 5


def test_concurrent_requests_are_batched_and_each_correct(client):
    jobs = [[SENTENCES[i] for i in SHORT[k:] + SHORT[:k]][: 1 + k % 3] for k in range(6)]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda texts: client.embeddings.create(model=NAME, input=texts), jobs))
    for texts, r in zip(jobs, results):
        ref = REF["embeddings"][[SENTENCES.index(t) for t in texts]]
        assert _cos([d.embedding for d in r.data], ref).min() >= 0.99999


def test_bad_requests_are_one_line_400s(client, server):
    with pytest.raises(openai.BadRequestError, match="dimensions=64 is not supported") as e:
        client.embeddings.create(model=NAME, input="hi", dimensions=64)
    assert e.value.body["param"] == "dimensions"
    assert len(client.embeddings.create(model=NAME, input="hi", dimensions=384).data[0].embedding) == 384
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="other", input="hi")
    with pytest.raises(openai.BadRequestError, match=r"input\[1\] is an empty string"):
        client.embeddings.create(model=NAME, input=["fine", ""])
    with pytest.raises(openai.BadRequestError, match="maximum is 254 tokens"):
        client.embeddings.create(model=NAME, input=[1000] * 300)
    with pytest.raises(openai.BadRequestError, match="sentence encoder"):
        client.completions.create(model=NAME, prompt="hi")
    r = httpx.post(server[1] + "/v1/embeddings", json={"model": NAME, "input": "hi", "encoding_format": "hex"}, timeout=WAIT)
    assert r.status_code == 400 and r.json()["error"]["param"] == "encoding_format"
    r = httpx.post(server[1] + "/v1/embeddings", json={"model": NAME, "input": []}, timeout=WAIT)
    assert r.status_code == 400 and r.json()["error"]["message"] == "input is empty"


def test_sigterm_stops_the_server(server):
    proc, _ = server
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(WAIT) == 0
