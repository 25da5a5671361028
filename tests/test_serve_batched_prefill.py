"""The serving engine's batched prefill: requests admitted in the same scheduler turn are prefilled
together (grouped by prompt bucket, a few rows per call) and give exactly the tokens each gives
alone. Real SmolLM2, the engine as a library object, one engine per module.

Requests are made to arrive together without touching the engine's internals: a first request
with ``max_tokens=1`` submits them from its ``on_event`` callback (on the engine's thread, during
its admission), so they are all waiting when the engine next takes newcomers."""

from __future__ import annotations

import threading

import pytest

from maxjax.serve import Engine, SamplingParams

MAX_BATCH, CONTEXT, BUDGET = 4, 128, 128
WAIT = 120  # seconds any request may take here (a shared CI machine)

PROMPTS = [
    "The quick brown fox",
    "Once upon a time",
    "def fibonacci(n):",
    "A long time ago in a galaxy far, far away, there lived a young farm boy who dreamed of",
]


@pytest.fixture(scope="module")
def lm(smollm2):
    return smollm2


@pytest.fixture(scope="module")
def engine(lm):
    eng = Engine(lm, max_batch=MAX_BATCH, max_context=CONTEXT, prefill_budget=BUDGET)
    eng.start()
    yield eng
    eng.stop()
    assert not eng.running


def _calls(engine) -> float:
    return engine.metrics.prefill_calls._value.get()


def _together(lm, engine, jobs):
    """Submits ``jobs`` [(prompt ids, params)] so that the engine admits them in one turn; returns
    their requests and the prefill calls their admission took."""
    box: dict = {}
    ready = threading.Event()

    def on_event(event):
        if event.finish_reason is not None and "reqs" not in box:
            box["before"] = _calls(engine)
            box["reqs"] = [engine.submit(ids, p) for ids, p in jobs]
            ready.set()

    engine.submit(lm.encode_prompt("Hi"), SamplingParams(max_tokens=1), on_event=on_event)
    assert ready.wait(WAIT)
    results = [r.result(WAIT) for r in box["reqs"]]
    return results, _calls(engine) - box["before"]


def test_warmup_compiles_batched_shapes_within_the_budget_only(engine):
    steps = engine.steps
    assert steps.prefill_rows == (1, 2, 4)
    assert {p for n, p in steps.prefill_shapes if n == 1} == set(engine.buckets.prompt)  # one row: every bucket
    assert sorted((n, p) for n, p in steps.prefill_shapes if n > 1) == [(2, 16), (2, 32), (2, 64), (4, 16), (4, 32)]
    names = [n for n, _ in steps.programs()]
    assert "prefill[4x32]" in names and "insert[4->4x128]" in names and "prefill[4x64]" not in names


def test_greedy_prompts_admitted_together_take_fewer_prefills_and_give_their_tokens_alone(lm, engine):
    jobs = [(lm.encode_prompt(p), SamplingParams(max_tokens=m)) for p, m in zip(PROMPTS, (9, 14, 6, 10))]
    alone = []
    for ids, params in jobs:
        before = _calls(engine)
        alone.append(engine.generate(ids, params, timeout=WAIT))
        assert _calls(engine) - before == 1  # alone: one prefill call (the one-row program)
    together, calls = _together(lm, engine, jobs)
    # three prompts of bucket 16 in one call (4 rows, 64 tokens), the long one (bucket 32) in another
    assert [engine.buckets.prompt_for(len(ids)) for ids, _ in jobs] == [16, 16, 16, 32]
    assert calls == 2
    for p, a, t in zip(PROMPTS, alone, together):
        assert t.token_ids == a.token_ids, p
        assert t.text == a.text and t.finish_reason == a.finish_reason
    assert engine.compiles_while_serving == 0


def test_each_row_keeps_its_own_sampling_parameters_and_seed(lm, engine):
    ids = lm.encode_prompt(PROMPTS[0])
    params = [
        SamplingParams(max_tokens=12),  # greedy
        SamplingParams(max_tokens=12, temperature=0.9, top_k=40, top_p=0.95, seed=1234),
        SamplingParams(max_tokens=12, temperature=1.5, seed=7),
        SamplingParams(max_tokens=12, temperature=1.5, top_k=1, seed=8),  # top_k 1: greedy, whatever the temperature
    ]
    alone = [engine.generate(ids, p, timeout=WAIT).token_ids for p in params]
    together, calls = _together(lm, engine, [(ids, p) for p in params])
    assert calls == 1  # four prompts of bucket 16: one call
    assert [r.token_ids for r in together] == alone
    assert alone[3] == alone[0]  # top_k=1 in its row
    assert alone[1] != alone[0] and alone[2] != alone[0] and alone[1] != alone[2]  # sampled, each with its seed
    assert engine.compiles_while_serving == 0


def test_the_budget_counts_padded_rows_and_splits_a_turn(lm, engine):
    """Four prompts of bucket 64: a call of 2 rows costs 128 tokens, the budget; a third would need
    another call (192 > 128), so two are admitted in one turn and the other two in the next."""
    base = lm.encode_prompt(PROMPTS[3])
    jobs = [((base * 3)[: 40 + i], SamplingParams(max_tokens=5)) for i in range(4)]
    assert {engine.buckets.prompt_for(len(ids)) for ids, _ in jobs} == {64}
    alone = [engine.generate(ids, p, timeout=WAIT).token_ids for ids, p in jobs]
    together, calls = _together(lm, engine, jobs)
    assert calls == 2
    assert [r.token_ids for r in together] == alone
    assert engine.compiles_while_serving == 0
    assert engine.metrics.compiles._value.get() == 0


def test_a_request_cancelled_before_its_turn_leaves_the_others_of_the_turn_intact(lm, engine):
    jobs = [(lm.encode_prompt(p), SamplingParams(max_tokens=6)) for p in PROMPTS[:3]]
    alone = [engine.generate(ids, p, timeout=WAIT).token_ids for ids, p in jobs]
    box: dict = {}
    ready = threading.Event()

    def on_event(event):
        if event.finish_reason is not None and "reqs" not in box:
            box["before"] = _calls(engine)
            box["reqs"] = [engine.submit(ids, p) for ids, p in jobs]
            box["reqs"][1].cancel()  # waiting, not yet admitted
            ready.set()

    engine.submit(lm.encode_prompt("Hi"), SamplingParams(max_tokens=1), on_event=on_event)
    assert ready.wait(WAIT)
    results = [r.result(WAIT) for r in box["reqs"]]
    assert results[1].finish_reason == "cancelled" and results[1].token_ids == []
    assert [results[0].token_ids, results[2].token_ids] == [alone[0], alone[2]]
    assert _calls(engine) - box["before"] == 1  # the two left: one call of 2 rows
