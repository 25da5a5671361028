"""``/v1/embeddings``'s request timeout and client disconnects, on a real uvicorn server (in a
thread, on a free localhost port) over the bundled all-MiniLM-L6-v2, driven by ``httpx``: a request
past the timeout gets a 504 and its waiting rows are never run; a client that hangs up frees the
queue the same way. Every wait is bounded."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from maxjax.models import load_encoder
from maxjax.serve.app import create_app
from maxjax.serve.encoder_engine import EncoderEngine
from net_util import free_port

NAME = "minilm"
LONG = ["word " * 250] * 64  # 64 rows of 252 tokens: 16 passes of 4 rows, seconds of work


@pytest.fixture(scope="module")
def encoder():
    enc = load_encoder()
    enc.embed_ids([[101, 102]], batch_size=4)  # compile the one-short-row shape the tests send after
    return enc


def _serve(engine: EncoderEngine):
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine, model_name=NAME), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start within 60 s"
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{port}"


def _idle(engine: EncoderEngine, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while engine._waiting or engine.metrics.batch_size._value.get() != 0:
        assert time.monotonic() < deadline, "engine still busy"
        time.sleep(0.05)


@pytest.mark.parametrize("how", ["timeout", "disconnect"])
def test_a_dropped_request_frees_the_engine(encoder, how):
    engine = EncoderEngine(encoder, max_batch=4, max_queue=8, request_timeout=0.5 if how == "timeout" else 120)
    server, thread, base = _serve(engine)
    try:
        t0 = time.monotonic()
        if how == "timeout":
            r = httpx.post(base + "/v1/embeddings", json={"model": NAME, "input": LONG}, timeout=60)
            assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(base + "/v1/embeddings", json={"model": NAME, "input": LONG}, timeout=0.5)
        assert time.monotonic() - t0 < 30
        _idle(engine)
        assert engine.passes < 16  # the rows still waiting when it was dropped never ran
        assert engine.metrics.finished.labels(finish_reason="timeout" if how == "timeout" else "cancelled")._value.get() == 1
        # the engine is idle again: one short row (its shape compiled) is well inside 0.5 s
        r = httpx.post(base + "/v1/embeddings", json={"model": NAME, "input": ["still serving"]}, timeout=60)
        assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive()


def test_cancel_of_an_ended_job_does_nothing(encoder):
    engine = EncoderEngine(encoder, max_batch=4).start()
    try:
        job = engine.submit([[101, 7592, 102]])
        assert job.done.wait(60) and job.error is None
        engine.cancel(job)
        assert job.finish_reason == "stop" and job.error is None
    finally:
        engine.stop()
    with pytest.raises(ValueError, match="request_timeout must be positive"):
        EncoderEngine(encoder, request_timeout=0)


@pytest.mark.parametrize(
    "flags", [["--mesh", "tp=2"], ["--dtype", "bfloat16"], ["--max-context", "128"], ["--quantized-layout", "unpacked"]]
)
def test_generation_flags_are_refused_for_an_encoder(flags, capsys):
    from maxjax._bundled import minilm_dir
    from maxjax.cli import main

    assert main(["serve", "--model", str(minilm_dir()), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"maxjax serve: error: {flags[0]} apply to text generation, not to an encoder (embeddings) model"]
