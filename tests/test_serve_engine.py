"""The continuous-batching engine as a library object (no HTTP): real SmolLM2, one engine per module.

The engine has 4 rows, so 6 requests make rows join and leave the running batch; every shape is
compiled by its warmup and nothing compiles after it."""

from __future__ import annotations

import time

import pytest
from hypothesis import example, given, settings, strategies as st

from maxjax.serve import ContextLengthExceeded, Engine, EngineStopped, SamplingParams
from maxjax.serve.text import StopStrings

MAX_BATCH, CONTEXT = 4, 128
WAIT = 120  # seconds any request may take here (a shared CI machine)

PROMPTS = [
    "The quick brown fox",
    "Once upon a time",
    "def fibonacci(n):",
    "The capital of France is",
    "Q: What is 2 + 2?\nA:",
    "A long time ago in a galaxy far, far away, there lived a young farm boy who dreamed of",
]
MAX_TOKENS = [9, 14, 6, 12, 5, 10]


@pytest.fixture(scope="module")
def lm(smollm2):
    return smollm2


@pytest.fixture(scope="module")
def engine(lm):
    eng = Engine(lm, max_batch=MAX_BATCH, max_context=CONTEXT, shrink_after=2)
    eng.start()
    yield eng
    eng.stop()
    assert not eng.running


@pytest.fixture(scope="module")
def references(lm):
    return [lm.generate([p], max_new_tokens=m)[0] for p, m in zip(PROMPTS, MAX_TOKENS)]


def _ids(lm, text):
    return lm.encode_prompt(text)


def test_requests_joining_and_leaving_the_batch_equal_generate_and_never_compile(lm, engine, references):
    assert engine.warmup_seconds is not None
    reqs = [engine.submit(_ids(lm, p), SamplingParams(max_tokens=m)) for p, m in zip(PROMPTS, MAX_TOKENS)]
    seen_batch = set()
    deadline = time.monotonic() + WAIT
    while not all(r.done for r in reqs) and time.monotonic() < deadline:  # bounded: WAIT seconds
        seen_batch.add(engine.batch_size)
        time.sleep(0.01)
    for p, r, g in zip(PROMPTS, [r.result(1) for r in reqs], references):
        assert r.text == g.text, p
        n = len(g.token_ids)
        assert r.token_ids[:n] == g.token_ids
        assert r.finish_reason == ("stop" if g.finish_reason == "eos" else "length")
        assert len(r.token_ids) == n + (g.finish_reason == "eos")
        assert r.time_to_first_token is not None and 0 < r.time_to_first_token <= r.latency
    assert max(seen_batch) == MAX_BATCH  # 6 requests for 4 rows: a full batch, then rows reused
    assert engine.compiles_while_serving == 0
    # idle again: the rows were freed and the cache released
    deadline = time.monotonic() + 5
    while engine.cache_shape is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.batch_size == 0 and engine.cache_shape is None


def test_streamed_events_join_to_the_text(lm, engine, references):
    req = engine.submit(_ids(lm, PROMPTS[1]), SamplingParams(max_tokens=MAX_TOKENS[1]))
    events = list(req.events(timeout=WAIT))
    assert "".join(e.text for e in events) == references[1].text
    assert [t for e in events for t in e.token_ids] == req.token_ids
    assert [e.finish_reason for e in events][-1] == "length" and all(e.finish_reason is None for e in events[:-1])


def test_stop_strings_cut_the_text_before_the_first_match(lm, engine, references):
    full = references[1].text  # ", the city of Nova Haven was ..."
    stop = full[12:16]
    req = engine.submit(_ids(lm, PROMPTS[1]), SamplingParams(max_tokens=MAX_TOKENS[1], stop=["zzz", stop]))
    events = list(req.events(timeout=WAIT))
    assert req.finish_reason == "stop"
    assert req.text == "".join(e.text for e in events) == full[: full.index(stop)]


def test_sampling_follows_the_seed_whatever_else_runs(lm, engine):
    params = SamplingParams(max_tokens=12, temperature=0.9, top_k=40, top_p=0.95, seed=1234)
    alone = engine.generate(_ids(lm, PROMPTS[0]), params).token_ids
    others = [engine.submit(_ids(lm, p), SamplingParams(max_tokens=12, temperature=1.0, seed=i)) for i, p in enumerate(PROMPTS[1:3])]
    crowded = engine.submit(_ids(lm, PROMPTS[0]), params)
    assert crowded.result(WAIT).token_ids == alone
    other_seed = engine.generate(_ids(lm, PROMPTS[0]), SamplingParams(max_tokens=12, temperature=0.9, seed=99)).token_ids
    assert other_seed != alone
    for r in others:
        r.result(WAIT)


def test_cancel_and_timeout_free_the_row(lm, engine):
    long = SamplingParams(max_tokens=CONTEXT - 16)
    req = engine.submit(_ids(lm, PROMPTS[0]), long)
    events = req.events(timeout=WAIT)
    first = next(events)
    assert first.finish_reason is None
    req.cancel()
    rest = list(events)  # bounded: ends with the cancellation at the next step
    assert rest[-1].finish_reason == "cancelled" and req.finish_reason == "cancelled"
    assert len(req.token_ids) < long.max_tokens
    late = engine.submit(_ids(lm, PROMPTS[0]), long, timeout=0.3)
    assert late.result(WAIT).finish_reason == "timeout"
    assert engine.batch_size == 0
    assert engine.metrics.finished.labels(finish_reason="cancelled")._value.get() >= 1
    assert engine.metrics.finished.labels(finish_reason="timeout")._value.get() >= 1


def test_bad_requests_are_refused_naming_the_problem(lm, engine):
    with pytest.raises(ContextLengthExceeded, match=f"maximum context length is {CONTEXT} tokens"):
        engine.submit(_ids(lm, PROMPTS[0]), SamplingParams(max_tokens=CONTEXT))
    with pytest.raises(ValueError, match="temperature"):
        engine.submit(_ids(lm, PROMPTS[0]), SamplingParams(temperature=-1.0))
    with pytest.raises(ValueError, match="max_tokens"):
        engine.submit(_ids(lm, PROMPTS[0]), SamplingParams(max_tokens=0))
    with pytest.raises(ValueError, match="stop"):
        engine.submit(_ids(lm, PROMPTS[0]), SamplingParams(stop=[""]))
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.submit([], SamplingParams())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.submit([lm.config.vocab_size], SamplingParams())
    with pytest.raises(EngineStopped):
        Engine(lm, max_batch=1, max_context=16, warmup=False).submit([1], SamplingParams())


def test_nothing_compiled_while_serving(engine):
    """After every request above (rows joining, leaving, moving down as the cache shrinks, steps
    dispatched ahead, sampling, cancellation), the engine's thread has compiled nothing."""
    assert engine.compiles_while_serving == 0
    assert engine.metrics.compiles._value.get() == 0


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet="ab.\n", max_size=30),
    cuts=st.lists(st.integers(0, 30), max_size=8),
    stops=st.lists(st.text(alphabet="ab.\n", min_size=1, max_size=3), max_size=3),
)
@example(text=".aa", cuts=[2], stops=["a", ".aa"])  # ".a" shows "a", but ".aa" starts earlier
@example(text=".aa", cuts=[2, 3], stops=["a", ".aab"])  # held back, then the end decides: cut at "a"
def test_stop_strings_give_openais_cut_for_any_split_of_the_text(text, cuts, stops):
    """The pieces out of StopStrings join to the text before the earliest stop string, however
    the text arrives."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    expected = text[: min(hits)] if hits else text
    s = StopStrings(stops)
    bounds = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    out, stopped = "", False
    for a, b in zip(bounds, bounds[1:]):
        piece, stopped = s.add(text[a:b])
        out += piece
        if stopped:
            break
    if not stopped:
        out += s.flush()
    assert out == expected
    assert s.stopped == bool(hits)  # decided by add, or at the end by flush


@pytest.mark.parametrize(
    "argv, message",
    [
        (["serve", "--max-batch", "0"], "--max-batch: must be at least 1, got 0"),
        (["serve", "--port", "http"], "--port: expected an integer, got 'http'"),
        (["serve", "--request-timeout", "0"], "--request-timeout: must be at least 0.001, got 0"),
    ],
)
def test_serve_cli_refuses_bad_arguments(capsys, argv, message):
    from maxjax.cli import SUBCOMMANDS, main

    assert "serve" in [c.name for c in SUBCOMMANDS]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_serve_cli_refuses_a_context_beyond_the_models_in_one_line(capsys):
    from maxjax.cli import main

    assert main(["serve", "--max-context", "100000", "--no-warmup"]) == 1
    err = capsys.readouterr().err
    assert "maxjax serve: error: max_context (100000) exceeds the model's context of 8192 tokens" in err
    assert "Traceback" not in err
