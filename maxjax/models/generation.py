"""The generation loop: batched prefill, then one decode step per token, streamed as it goes.

:func:`run_generation` is what ``CausalLM.generate``/``generate_tokens`` run; :func:`stream`
yields text pieces from a worker thread. Prompt lengths are rounded up to a few buckets
(:data:`PROMPT_BUCKETS`) and caches to multiples of :data:`CACHE_ROUND` positions, so a new prompt
length rarely compiles.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.engine.compiles import compile_counter

__all__ = ["Generation", "NonFiniteLogitsError", "PROMPT_BUCKETS", "CACHE_ROUND", "check_request", "run_generation", "stream"]

PROMPT_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
CACHE_ROUND = 128


class NonFiniteLogitsError(ValueError):
    """The model computed NaN or infinite logits (weights or metadata with non-finite or
    out-of-range values): an error rather than tokens chosen from garbage (e.g. a silent EOS)."""


@jax.jit
def _finite_rows(logits: jax.Array) -> jax.Array:
    """Whether each row's logits are all finite: one reduction on the device, read with the tokens
    (about 0.1 ms a step on a CPU, overlapped with the next step)."""
    return jnp.isfinite(logits).all(axis=-1)


@dataclass
class Generation:
    """One prompt's result: the new token ids and text, and how long it took.

    ``time_to_first_token`` is seconds from the start of the batch to its first sampled token
    (compiling the prefill, when this shape is new, included); ``decode_seconds`` is the time spent
    in decode steps after that, less ``compile_seconds`` of them; ``compile_seconds`` is the time
    this call spent compiling (0 once every shape it needs has been compiled). ``kv_cache_bytes``
    is the size of the batch's key and value caches (sized by the request: the prompt's bucket plus
    ``max_new_tokens``, rounded up, never past the context).
    """

    prompt: str
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"
    time_to_first_token: float = 0.0
    decode_seconds: float = 0.0
    compile_seconds: float = 0.0
    kv_cache_bytes: int = 0

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: new tokens after the first, per second of decoding."""
        n = len(self.token_ids) - 1
        return n / self.decode_seconds if n > 0 and self.decode_seconds > 0 else 0.0


def _bucket(n: int, limit: int) -> int:
    for b in PROMPT_BUCKETS:
        if b >= n:
            return min(b, limit)
    return limit


def check_request(rows: int, max_new_tokens: int) -> None:
    """The checks ``generate`` and ``generate_tokens`` share: some rows, at least one new token.

    Raises:
        ValueError: no rows, or ``max_new_tokens < 1``.
    """
    if not rows:
        raise ValueError("no prompts given")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")


def run_generation(lm: Any, *args: Any, **kwargs: Any) -> list[Generation]:
    """:func:`_generate`, then the heap its caches and temporary buffers held given back to the
    system where the policy says so (``release_freed_heap``: the next call's buffers would
    otherwise land beside them)."""
    try:
        return _generate(lm, *args, **kwargs)
    finally:
        lm.release_freed_heap()


def _generate(
    lm: Any,
    ids: list[list[int]],
    prompts: list[str],
    max_new_tokens: int,
    start: float,
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int,
    stop_at_eos: bool,
    on_token: Callable[[int, int], None] | None,
) -> list[Generation]:
    """Generates for the (validated) prompt token ids ``ids``, all rows in one batch.

    Prompts are right-padded to a length bucket; the prefill runs them together, then each decode
    step makes one token for every row, dispatched before the host reads the previous step's
    tokens (device and host overlap). A row that ends (EOS) computes one token more, dropped.

    Raises:
        ValueError: the longest prompt plus ``max_new_tokens`` exceeds the model's context.
        NonFiniteLogitsError: (a ValueError) a row still generating got NaN or infinite logits
            (checked on the device at every step, before that step's tokens are given out).
    """
    context = lm.config.max_position_embeddings
    longest = max(len(i) for i in ids)
    if longest + max_new_tokens > context:
        raise ValueError(
            f"the prompt ({longest} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the model's "
            f"context of {context} tokens"
        )
    b = len(ids)
    bucket = _bucket(longest, context)
    cache_len = min(context, -(-(bucket + max_new_tokens) // CACHE_ROUND) * CACHE_ROUND)
    rows = b + (-b % getattr(lm, "batch_multiple", 1))  # a data-parallel mesh runs whole rows per device
    tokens = np.zeros((rows, bucket), np.int32)
    for r, row in enumerate(ids):
        tokens[r, : len(row)] = row
    lengths = np.array([len(r) for r in ids] + [1] * (rows - b), np.int32)
    k_cache, v_cache = lm.new_cache(rows, cache_len)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    do_sample = temperature > 0
    key = sub = None  # greedy steps take the model's default key (no PRNG program to compile)
    if do_sample:
        key, sub = jax.random.split(jax.random.key(seed))
    compile_s = 0.0

    compiles = compile_counter()  # XLA compiles on this thread: the model's and the small ones around it

    def timed(call: Callable[[], Any]) -> Any:  # a call that compiles adds its time to compile_s
        nonlocal compile_s
        n0, t0 = compiles(), time.perf_counter()
        out = call()  # jit dispatch returns once compiled, before the device has run it
        if compiles() != n0:
            lm.release_freed_heap()  # what the compiler freed, while the device starts on the call
            compile_s += time.perf_counter() - t0
        return out

    if max_new_tokens > 1 and lm.program.policy.compile_decode_first and lm.weights_mapped:
        timed(lambda: lm.compile_decode(rows, cache_len, do_sample))  # before the prompt makes the weights resident
    nxt, logits, k_cache, v_cache = timed(lambda: lm.prefill(tokens, lengths, k_cache, v_cache, sub, **sampling))
    # the prefill's logits are checked on the host (once: no compile before the first token), each
    # decode step's on the device (_finite_rows, compiled with the first decode step)
    finite = np.isfinite(np.asarray(logits)).all(axis=-1)
    eos = lm.tokenizer.eos_token_ids if stop_at_eos else frozenset()
    kv_bytes = int(k_cache.nbytes + v_cache.nbytes)
    results = [Generation(p, i, kv_cache_bytes=kv_bytes) for p, i in zip(prompts, ids)]
    done = np.zeros(b, bool)
    positions = lengths.copy()

    def check_finite(finite: Any, n: int) -> None:  # before new token n of each row is given out
        ok = np.asarray(finite)
        bad = [r for r in range(b) if not done[r] and not ok[r]]
        if bad:
            source = getattr(lm, "source", "") or "the model"
            raise NonFiniteLogitsError(
                f"{source}: the model computed non-finite logits (NaN or infinity) for new token {n} of row {bad[0]}: "
                "its weights or metadata hold non-finite or out-of-range values"
            )

    def emit(host: np.ndarray) -> None:
        for r in range(b):
            if done[r]:
                continue
            t = int(host[r])
            if t in eos:
                done[r] = True
                results[r].finish_reason = "eos"
                continue
            results[r].token_ids.append(t)
            if on_token is not None:
                on_token(r, t)

    def step(tokens: Any, positions: np.ndarray, k_cache: Any, v_cache: Any, key: Any):
        sub = key
        if do_sample:
            key, sub = jax.random.split(key)
        nxt, logits, k_cache, v_cache = lm.decode_step(tokens, positions, k_cache, v_cache, sub, **sampling)
        return nxt, _finite_rows(logits), k_cache, v_cache, key

    host = np.asarray(nxt)
    first = time.perf_counter() - start
    check_finite(finite, 1)
    emit(host)  # the first tokens go out before the first decode step (and its compile)
    prefill_compile_s = compile_s
    if not done.all() and max_new_tokens > 1:
        nxt, finite, k_cache, v_cache, key = timed(lambda: step(nxt, positions, k_cache, v_cache, key))
        positions = positions + 1
        for n in range(2, max_new_tokens + 1):
            # The device makes token n + 1 while the host reads token n: the next step is
            # dispatched on the device-resident tokens before they are copied to the host (a
            # row that has just ended computes one token more, which is dropped).
            pending = step(nxt, positions, k_cache, v_cache, key) if n < max_new_tokens else None
            positions = positions + 1
            host = np.asarray(nxt)
            check_finite(finite, n)
            emit(host)
            if pending is None or done.all():
                break
            nxt, finite, k_cache, v_cache, key = pending
    total = time.perf_counter() - start
    for r in results:
        r.text = lm.tokenizer.decode(r.token_ids)
        r.time_to_first_token = first
        r.decode_seconds = total - first - (compile_s - prefill_compile_s)
        r.compile_seconds = compile_s
    return results


def stream(lm: Any, prompt: str, max_new_tokens: int = 64, **kwargs: Any) -> Iterator[str]:
    """Yields the text of ``prompt``'s continuation piece by piece, as tokens are made.

    Runs :meth:`generate` on a worker thread; the pieces joined equal ``generate(...).text``.
    The final :class:`Generation` is available as ``lm.last_generation`` afterwards.
    """
    import queue
    import threading

    q: queue.Queue[Any] = queue.Queue()
    detok = lm.tokenizer.incremental_detokenizer()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = lm.generate([prompt], max_new_tokens, on_token=lambda r, t: q.put(t), **kwargs)[0]
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e
        q.put(None)

    threading.Thread(target=work, daemon=True).start()
    while (t := q.get()) is not None:
        piece = detok.add(t)
        if piece:
            yield piece
    tail = detok.flush()
    if tail:
        yield tail
    if "error" in box:
        raise box["error"]
    lm.last_generation = box["result"]
