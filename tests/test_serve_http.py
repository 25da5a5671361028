"""``maxjax serve`` over real HTTP: one server process per module on a free localhost port, driven by
the official ``openai`` client and by ``httpx``. Every loop is bounded in count and time.

The server has 4 batch rows, a queue of 16 and a context of 128 tokens; its answers are compared
with ``load_model().generate`` in this process. The last test stops it with SIGTERM."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from net_util import free_port


MAX_BATCH, MAX_QUEUE, CONTEXT = 4, 16, 128
START_TIMEOUT = 420  # seconds for the server to load and compile (a busy CI machine)
WAIT = 120  # seconds any one request may take


class Server:
    def __init__(self, proc: subprocess.Popen, base: str, log: Path):
        self.proc, self.base, self.log = proc, base, log

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def metric(self, name: str) -> float:
        text = httpx.get(self.base + "/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                if line.split(" ")[0] == name or line.startswith(name + "{"):
                    return float(line.rsplit(" ", 1)[1])
        return 0.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    argv = [
        sys.executable, "-m", "maxjax.cli", "serve", "--port", str(port), "--max-batch", str(MAX_BATCH),
        "--max-queue", str(MAX_QUEUE), "--max-context", str(CONTEXT), "--shutdown-timeout", "60",
    ]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    srv = Server(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"maxjax serve exited with {proc.returncode}:\n{srv.output()}")
            if time.monotonic() > deadline:
                pytest.fail(f"maxjax serve did not answer /health within {START_TIMEOUT} s:\n{srv.output()}")
            try:
                if httpx.get(srv.base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        yield srv
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


@pytest.fixture(scope="module")
def lm(smollm2):
    return smollm2


@pytest.fixture(scope="module")
def model_name(server):
    return httpx.get(server.base + "/v1/models", timeout=10).json()["data"][0]["id"]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=WAIT)


def _usage_ok(usage, prompt_tokens, completion_tokens):
    assert usage.prompt_tokens == prompt_tokens
    assert usage.completion_tokens == completion_tokens
    assert usage.total_tokens == prompt_tokens + completion_tokens


def _completion_tokens(g):  # the engine counts the end-of-generation token it generated
    return len(g.token_ids) + (g.finish_reason == "eos")


def test_models_health_and_metrics(server, model_name):
    assert model_name == "SmolLM2-135M-Instruct.Q4_1"
    models = httpx.get(server.base + "/v1/models", timeout=10).json()
    assert models["object"] == "list" and models["data"][0]["max_model_len"] == CONTEXT
    assert httpx.get(server.base + "/health", timeout=10).json() == {"status": "ok"}
    r = httpx.get(server.base + "/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    for name in (
        "maxjax_queue_depth", "maxjax_running_batch_size", "maxjax_generation_tokens_per_second",
        "maxjax_time_to_first_token_seconds_bucket", "maxjax_request_latency_seconds_bucket",
        "maxjax_inter_token_latency_seconds_bucket",
    ):  # fmt: skip
        assert name in r.text
    assert server.metric("maxjax_batch_slots") == MAX_BATCH


def test_completions_stream_and_not_equal_generate(client, model_name, lm):
    prompt, n = "The quick brown fox", 12
    g = lm.generate([prompt], max_new_tokens=n)[0]
    out = client.completions.create(model=model_name, prompt=prompt, max_tokens=n, temperature=0)
    assert out.choices[0].text == g.text
    assert out.choices[0].finish_reason == "length"
    _usage_ok(out.usage, len(g.prompt_ids), n)
    pieces, finish, usage = [], None, None
    for chunk in client.completions.create(model=model_name, prompt=prompt, max_tokens=n, temperature=0, stream=True):
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == g.text and finish == "length"
    _usage_ok(usage, len(g.prompt_ids), n)


def test_chat_stream_and_not_equal_generate_with_the_chat_template(client, model_name, lm):
    question, n = "What is the capital of France?", 24
    g = lm.generate([question], max_new_tokens=n, chat=True)[0]
    assert g.finish_reason == "eos"  # the answer ends before n tokens
    messages = [{"role": "user", "content": question}]
    out = client.chat.completions.create(model=model_name, messages=messages, max_tokens=n, temperature=0)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == g.text
    assert out.choices[0].finish_reason == "stop"
    _usage_ok(out.usage, len(g.prompt_ids), _completion_tokens(g))
    pieces, roles, finish, usage = [], [], None, None
    for chunk in client.chat.completions.create(model=model_name, messages=messages, max_tokens=n, temperature=0, stream=True):
        if chunk.choices:
            d = chunk.choices[0].delta
            roles += [d.role] if d.role else []
            pieces.append(d.content or "")
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    assert roles == ["assistant"] and "".join(pieces) == g.text and finish == "stop"
    _usage_ok(usage, len(g.prompt_ids), _completion_tokens(g))


def test_sse_wire_format(server, model_name, lm):
    """Raw server-sent events: one JSON chunk per ``data:`` line, a usage chunk, then ``[DONE]``;
    a stop string ends the text before it (finish_reason "stop")."""
    prompt = "Once upon a time"
    g = lm.generate([prompt], max_new_tokens=14)[0]
    stop = g.text[12:16]
    body = {"model": model_name, "prompt": prompt, "max_tokens": 14, "temperature": 0, "stream": True, "stop": [stop]}
    with httpx.stream("POST", server.base + "/v1/completions", json=body, timeout=WAIT) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        data = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "text_completion" and c["model"] == model_name for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == len(g.prompt_ids)
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == g.text[: g.text.index(stop)]


PROMPTS = [
    "Hi",
    "The quick brown fox",
    "Once upon a time",
    "def fibonacci(n):",
    "The capital of France is",
    "Q: What is 2 + 2?\nA:",
    "In 1492, Columbus",
    "Water boils at",
    "My favourite recipe for pancakes is",
    "import numpy as np\n",
    "Dear Sir or Madam,",
    "The three laws of robotics are",
    "Photosynthesis is the process by which",
    "Roses are red,",
    "Breaking news: scientists have discovered",
    "A long time ago in a galaxy far, far away, there lived a young farm boy who dreamed of adventure among the stars and",
]


def test_16_concurrent_clients_get_their_own_answers(client, model_name, lm, server):
    """16 clients at once (4 batch rows: requests queue, join and leave), different prompt lengths
    and max_tokens, half of them streaming: each gets generate's answer for its own prompt."""
    max_tokens = [4 + (5 * i) % 17 for i in range(len(PROMPTS))]
    refs = [lm.generate([p], max_new_tokens=m)[0] for p, m in zip(PROMPTS, max_tokens)]
    start = threading.Barrier(len(PROMPTS), timeout=WAIT)

    def ask(i):
        start.wait()
        kw = dict(model=model_name, prompt=PROMPTS[i], max_tokens=max_tokens[i], temperature=0)
        if i % 2:
            return "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
        return client.completions.create(**kw).choices[0].text

    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(ask, range(len(PROMPTS)), timeout=4 * WAIT))
    for p, a, g in zip(PROMPTS, answers, refs):
        assert a == g.text, p
    assert server.metric("maxjax_running_batch_size") == 0
    assert server.metric("maxjax_engine_compiles_total") == 0  # every shape was compiled at start-up


def test_a_client_that_disconnects_mid_stream_frees_its_slot(server, model_name):
    cancelled = server.metric('maxjax_requests_finished_total{finish_reason="cancelled"}')
    body = {"model": model_name, "prompt": "Once upon a time", "max_tokens": CONTEXT - 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.base + "/v1/completions", json=body, timeout=WAIT) as r:
        lines = r.iter_lines()
        got = [line for _, line in zip(range(4), lines)]  # a few events, then hang up
        assert any(line.startswith("data: ") for line in got)
        assert server.metric("maxjax_running_batch_size") == 1
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.metric('maxjax_requests_finished_total{finish_reason="cancelled"}') == cancelled + 1:
            break
        time.sleep(0.1)
    assert server.metric('maxjax_requests_finished_total{finish_reason="cancelled"}') == cancelled + 1
    assert server.metric("maxjax_running_batch_size") == 0


def test_a_full_queue_answers_429_and_a_burst_of_200_leaves_the_server_serving(server, model_name, lm):
    expected = lm.generate(["Hi"], max_new_tokens=6)[0].text
    body = {"model": model_name, "prompt": "Hi", "max_tokens": 6, "temperature": 0}

    async def burst():
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.base, limits=limits, timeout=4 * WAIT) as http:
            return await asyncio.gather(*[http.post("/v1/completions", json=body) for _ in range(200)])

    rejected_before = server.metric('maxjax_requests_rejected_total{reason="queue_full"}')
    responses = asyncio.run(burst())
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 429}, codes
    # The queue holds MAX_QUEUE waiting requests; the engine moves waiting requests to its rows at
    # step boundaries, so a burst is guaranteed a full queue plus at least one running row (more
    # when the engine wakes after several have arrived).
    assert codes.count(429) > 0 and codes.count(200) >= MAX_QUEUE + 1
    for r in responses:
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["code"] == "queue_full"
        else:
            assert r.json()["choices"][0]["text"] == expected
    assert server.metric('maxjax_requests_rejected_total{reason="queue_full"}') == rejected_before + codes.count(429)
    assert httpx.get(server.base + "/health", timeout=10).status_code == 200
    again = httpx.post(server.base + "/v1/completions", json=body, timeout=WAIT)
    assert again.status_code == 200 and again.json()["choices"][0]["text"] == expected


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, model_name, client, lm):
    url = server.base + "/v1/completions"

    def post(payload, url=url):
        if isinstance(payload, str):  # raw bytes, said to be JSON
            r = httpx.post(url, content=payload, headers={"content-type": "application/json"}, timeout=WAIT)
        else:
            r = httpx.post(url, json=payload, timeout=WAIT)
        return r.status_code, r.json()["error"]

    ok = {"model": model_name, "prompt": "Hi", "max_tokens": 4}
    status, err = post('{"model": "x", "prompt": ')
    assert status == 400 and err["code"] == "invalid_json"
    for field, value in [("temperature", "hot"), ("max_tokens", 0), ("max_tokens", 2.5), ("top_p", 1.5), ("top_k", -1),
                         ("stream", "yes"), ("seed", "one"), ("stop", 3), ("prompt", 7)]:  # fmt: skip
        status, err = post({**ok, field: value})
        assert status == 400 and err["param"] == field and err["type"] == "invalid_request_error", (field, err)
        assert field in err["message"]
    status, err = post({k: v for k, v in ok.items() if k != "prompt"})
    assert status == 400 and err["param"] == "prompt" and "required" in err["message"]
    status, err = post({**ok, "n": 2})
    assert status == 400 and err["param"] == "n"
    status, err = post({**ok, "model": "gpt-4"})
    assert status == 404 and err["code"] == "model_not_found"
    status, err = post({"model": model_name, "messages": [{"role": "wizard", "content": "hi"}]}, url=server.base + "/v1/chat/completions")
    assert status == 400 and err["param"].startswith("messages.0.role")
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 20
    assert len(lm.encode_prompt(long_prompt)) > CONTEXT
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt=long_prompt, max_tokens=4)
    assert e.value.status_code == 400 and e.value.code == "context_length_exceeded"
    assert f"maximum context length is {CONTEXT} tokens" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": long_prompt}])
    assert e.value.code == "context_length_exceeded" and e.value.param == "messages"
    assert httpx.get(server.base + "/health", timeout=10).status_code == 200
    assert client.completions.create(model=model_name, prompt="Hi", max_tokens=3, temperature=0).usage.completion_tokens == 3


def in_flight(server) -> int:
    """Requests the server's engine holds (waiting for a row plus in the running batch), read from
    ``/metrics``."""
    text = httpx.get(server.base + "/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("maxjax_queue_depth", "maxjax_running_batch_size"):
            values[name] = float(value)
    return int(sum(values.values()))


def test_sigterm_ends_in_flight_requests_and_exits_cleanly(server, model_name, lm):
    """Runs last: SIGTERM while a streaming and a plain request are in flight. Both are finished
    (the server stops accepting, lets them end, stops the engine) and the process exits 0 with no
    traceback."""
    stream_body = {"model": model_name, "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "stream": True}
    plain_body = {"model": model_name, "prompt": "The quick brown fox", "max_tokens": 30, "temperature": 0}
    first_chunk = threading.Event()
    results = {}

    def stream():
        with httpx.stream("POST", server.base + "/v1/completions", json=stream_body, timeout=WAIT) as r:
            data = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    data.append(line[6:])
                    first_chunk.set()
            results["stream"] = data

    def plain():
        results["plain"] = httpx.post(server.base + "/v1/completions", json=plain_body, timeout=WAIT)

    threads = [threading.Thread(target=stream), threading.Thread(target=plain)]
    for t in threads:
        t.start()
    assert first_chunk.wait(WAIT)
    # The plain request's thread may not have connected yet (a loaded CI machine): wait until the
    # engine holds both requests, so that the signal finds two in flight.
    deadline = time.monotonic() + WAIT
    while in_flight(server) < 2:
        assert time.monotonic() < deadline and "stream" not in results, "the plain request never reached the engine"
        time.sleep(0.005)
    server.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(WAIT)
    assert server.proc.wait(WAIT) == 0
    plain_out = results["plain"].json()
    assert results["plain"].status_code == 200
    assert plain_out["choices"][0]["text"] == lm.generate([plain_body["prompt"]], max_new_tokens=30)[0].text
    data = results["stream"]
    assert data[-1] == "[DONE]"
    text = "".join(json.loads(d)["choices"][0]["text"] for d in data[:-1] if json.loads(d)["choices"])
    assert text == lm.generate([stream_body["prompt"]], max_new_tokens=40)[0].text
    log = server.output()
    assert "Traceback" not in log and "ERROR" not in log, log
    assert "Application shutdown complete" in log
