"""The serving functions a JAX user composes (issue 16, part 0): ``lm.functions`` (prefill, decode)
and ``maxjax.models.sampling.sample`` inside the user's own ``jax.jit`` (KV cache donated),
``jax.vmap`` over requests and ``shard_map``; no recompile for a seen shape; no compiler options
attached to them (those live in the backend policy, applied only where maxjax jits)."""

from __future__ import annotations

import contextlib
import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import jaxprs_in_params
from jax.sharding import NamedSharding, PartitionSpec as P

from maxjax.backend import BackendPolicy
from maxjax.models.sampling import greedy, sample

PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,"]
NEW = 6
BUCKET = 16
CACHE = 128


@pytest.fixture(scope="module")
def lm(smollm2):
    return smollm2


@pytest.fixture(scope="module")
def reference(lm):
    """Greedy continuations by ``lm.generate_tokens`` (all prompts in one batch)."""
    ids = [lm.tokenizer.encode(p) for p in PROMPTS]
    return ids, [g.token_ids for g in lm.generate_tokens(ids, NEW)]


@pytest.fixture(scope="module")
def jitted(lm):
    """The user's own jits of the pure functions, caches donated."""
    fns = lm.functions
    return jax.jit(fns.prefill, donate_argnums=(3, 4)), jax.jit(fns.decode, donate_argnums=(3, 4))


def _padded(ids_list, bucket=BUCKET):
    tokens = np.zeros((len(ids_list), bucket), np.int32)
    for r, ids in enumerate(ids_list):
        tokens[r, : len(ids)] = ids
    return tokens, np.array([len(i) for i in ids_list], np.int32)


@contextlib.contextmanager
def count_compiles(name):
    """Counts ``jax.log_compiles`` messages for jitted functions called ``name``."""
    seen = []
    pattern = re.compile(rf"Compiling jit\({re.escape(name)}\)")

    class Handler(logging.Handler):
        def emit(self, record):
            if pattern.search(record.getMessage()):
                seen.append(record.getMessage())

    handler = Handler(level=logging.DEBUG)
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            yield seen
    finally:
        logger.removeHandler(handler)


def test_user_jit_with_donated_caches_matches_generate(lm, reference, jitted):
    fns = lm.functions
    ids, expected = reference
    prefill, decode = jitted
    tokens, lengths = _padded(ids)
    k, v = fns.new_cache(len(ids), CACHE)
    logits, k2, v2 = prefill(lm.state, tokens, lengths, k, v)
    assert k.is_deleted() and v.is_deleted(), "the donated caches were not consumed"
    k, v = k2, v2
    assert logits.shape == (len(ids), lm.config.vocab_size) and logits.dtype == jnp.float32
    out = [greedy(logits)]
    positions = jnp.asarray(lengths)
    for _ in range(NEW - 1):
        logits, k, v = decode(lm.state, out[-1], positions, k, v)
        out.append(greedy(logits))
        positions = positions + 1
    got = np.stack([np.asarray(t) for t in out], axis=1)
    for r in range(len(ids)):
        assert got[r].tolist() == expected[r], PROMPTS[r]


def test_vmap_over_requests_gives_each_request_its_own_answer(lm, reference):
    """A leading request axis: each request is a batch of one with its own cache."""
    fns = lm.functions
    ids, expected = reference
    tokens, lengths = _padded(ids)
    tokens, lengths = tokens[:, None, :], lengths[:, None]  # [requests, 1, seq], [requests, 1]
    r = len(ids)
    k1, v1 = fns.new_cache(1, CACHE)
    k, v = jnp.broadcast_to(k1, (r, *k1.shape)), jnp.broadcast_to(v1, (r, *v1.shape))
    in_axes = (None, 0, 0, 0, 0)
    prefill = jax.jit(jax.vmap(fns.prefill, in_axes=in_axes), donate_argnums=(3, 4))
    decode = jax.jit(jax.vmap(fns.decode, in_axes=in_axes), donate_argnums=(3, 4))
    logits, k, v = prefill(lm.state, tokens, lengths, k, v)  # logits [requests, 1, vocab]
    nxt = jax.vmap(greedy)(logits)
    out = [nxt]
    positions = jnp.asarray(lengths)
    for _ in range(NEW - 1):
        logits, k, v = decode(lm.state, nxt, positions, k, v)
        nxt = jax.vmap(greedy)(logits)
        out.append(nxt)
        positions = positions + 1
    got = np.concatenate([np.asarray(t) for t in out], axis=1)
    for i in range(r):
        assert got[i].tolist() == expected[i], PROMPTS[i]


def test_decode_under_shard_map_over_the_batch_equals_unsharded(lm, reference, jitted):
    fns = lm.functions
    ids, _ = reference
    prefill, decode = jitted
    mesh = jax.make_mesh((2,), ("dp",))
    tokens, lengths = _padded(ids)
    k, v = fns.new_cache(2, CACHE)
    logits, k, v = prefill(lm.state, tokens, lengths, k, v)
    nxt = greedy(logits)
    want, _, _ = decode(lm.state, nxt, lengths, jnp.copy(k), jnp.copy(v))  # keeps k, v

    def put(x, spec):
        return jax.device_put(x, NamedSharding(mesh, spec))

    step = jax.jit(
        jax.shard_map(
            fns.decode,
            mesh=mesh,
            in_specs=(P(), P("dp"), P("dp"), P(None, "dp"), P(None, "dp")),
            out_specs=(P("dp"), P(None, "dp"), P(None, "dp")),
        ),
        donate_argnums=(3, 4),
    )
    got, k2, v2 = step(put(lm.state, P()), put(nxt, P("dp")), put(lengths, P("dp")), put(k, P(None, "dp")), put(v, P(None, "dp")))
    assert k2.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "dp")), k2.ndim)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-4)
    assert np.asarray(greedy(got)).tolist() == np.asarray(greedy(want)).tolist()


def test_a_user_step_never_recompiles_for_a_shape_it_has_seen(lm):
    """Decode plus per-row sampling in one user jit: new values (tokens, positions, temperatures,
    keys) never recompile; a new batch size or cache length compiles once, and only once."""
    fns = lm.functions

    def step(state, tokens, positions, k, v, keys, temperature, top_k, top_p):
        logits, k, v = fns.decode(state, tokens, positions, k, v)
        return sample(logits, keys, temperature, top_k, top_p), k, v

    jstep = jax.jit(step, donate_argnums=(3, 4))

    def run(batch, cache_len, seed):
        rng = np.random.default_rng(seed)
        k, v = fns.new_cache(batch, cache_len)
        tokens = rng.integers(0, 1000, batch).astype(np.int32)
        positions = rng.integers(0, 8, batch).astype(np.int32)
        keys = jax.random.split(jax.random.key(seed), batch)
        temperature = rng.uniform(0.5, 1.5, batch).astype(np.float32)
        top_k = rng.integers(0, 50, batch).astype(np.int32)
        top_p = rng.uniform(0.5, 1.0, batch).astype(np.float32)
        out, k, v = jstep(lm.state, tokens, positions, k, v, keys, temperature, top_k, top_p)
        assert out.shape == (batch,) and out.dtype == jnp.int32

    with count_compiles("step") as compiles:
        run(2, 64, 0)
        run(2, 64, 1)
        assert len(compiles) == 1
        run(3, 64, 2)
        run(2, 64, 3)
        run(3, 64, 4)
    assert len(compiles) == 2, compiles


def _compiler_options_in(jaxpr):
    found = []
    for eqn in jaxpr.eqns:
        if eqn.params.get("compiler_options_kvs"):
            found.append((eqn.primitive.name, eqn.params["compiler_options_kvs"]))
        for sub in jaxprs_in_params(eqn.params):
            found += _compiler_options_in(sub)
    return found


def test_the_pure_functions_carry_no_compiler_options(lm, monkeypatch):
    """CPU tuning lives in the backend policy and is applied only where maxjax jits: the pure
    functions never ask the policy for compiler options, and no jit inside them carries any (JAX
    would refuse a nested jit with options inside the user's jit)."""
    fns = lm.functions
    assert lm.program.policy.platform != "cpu" or lm.program.policy.compiler_options(np.float32)  # the policy has some
    monkeypatch.setattr(BackendPolicy, "compiler_options", lambda self, dtype=None: pytest.fail("compiler_options asked for"))
    k, v = fns.new_cache(2, 64)
    tokens = jnp.zeros((2, BUCKET), jnp.int32)
    lengths = jnp.array([3, 5], jnp.int32)
    jaxprs = {
        "prefill": jax.make_jaxpr(fns.prefill)(lm.state, tokens, lengths, k, v),
        "decode": jax.make_jaxpr(fns.decode)(lm.state, lengths, lengths, k, v),
        "forward": jax.make_jaxpr(fns.forward)(lm.state, tokens, tokens, k, v, lengths),
        "sample": jax.make_jaxpr(sample)(jnp.zeros((2, 10)), jax.random.split(jax.random.key(0), 2), 1.0, 0, 1.0),
    }
    for name, jaxpr in jaxprs.items():
        assert _compiler_options_in(jaxpr.jaxpr) == [], name
    # nested inside a user's jit that has options of its own: accepted (a nested jit with options is not)
    outer = jax.jit(lambda s, t, n, k, v: fns.prefill(s, t, n, k, v)[0], compiler_options={"xla_cpu_use_xnnpack": False})
    assert outer(lm.state, tokens, lengths, k, v).shape == (2, lm.config.vocab_size)
