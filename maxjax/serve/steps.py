"""The serving engine's compiled programs, one per shape of a small fixed set (:class:`Buckets`).

The engine's KV cache is two arrays of :meth:`DecoderFunctions.cache_shapes` ``(rows, cache_len)``
whose ``rows`` is a batch bucket and ``cache_len`` a cache bucket; the programs are jitted around
the model's pure functions (:attr:`CausalLM.functions`) with the backend policy's compiler options
and the caches donated:

- ``prefill`` (per prompt bucket): a right-padded prompt ``[1, bucket]`` into caches of its own
  (``cache_len = bucket``), and the first token chosen;
- ``decode`` (per ``(rows, cache_len)``): one token for every row, each with its own sampling
  parameters and random stream (greedy where its temperature is 0);
- ``place`` (per ``(bucket, cache_len)``) and ``insert`` (per ``(rows, cache_len)``): a prefilled
  prompt's caches padded to the engine's ``cache_len``, then written into one row;
- ``resize`` (between neighbouring shapes), ``move`` (one row to another) and ``fresh`` (zero caches).

:meth:`Steps.warmup` compiles all of them, so that serving never compiles.

A request's random stream: the threefry key ``[seed >> 32, seed & 0xffffffff]`` (what
``jax.random.key(seed)`` gives with 64-bit mode on), folded with the index of the token being drawn.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from maxjax.models.generation import PROMPT_BUCKETS
from maxjax.models.sampling import greedy, sample

__all__ = ["Buckets", "Steps", "key_data", "compile_counter"]


class _CompileCounter(threading.local):
    count = 0


_compiles = _CompileCounter()
_listening = False
_listen_lock = threading.Lock()


def _on_event(event: str, seconds: float, **kwargs: Any) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _compiles.count += 1


def compile_counter() -> Callable[[], int]:
    """A function giving the number of XLA compiles so far on the calling thread (a
    ``jax.monitoring`` listener, registered once per process)."""
    global _listening
    with _listen_lock:
        if not _listening:
            jax.monitoring.register_event_duration_secs_listener(_on_event)
            _listening = True
    return lambda: _compiles.count


def _fit(buckets: tuple[int, ...], n: int) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} is more than the largest bucket {buckets[-1]}")


@dataclasses.dataclass(frozen=True)
class Buckets:
    """The shapes the engine compiles: batch rows, cache lengths and prompt lengths (ascending).

    Use :meth:`default` for an engine of ``max_batch`` rows and a context of ``context`` tokens.

    Raises:
        ValueError: an empty or unsorted tuple, or buckets that do not cover ``batch[-1]`` rows,
            ``cache[-1]`` positions and prompts of up to ``cache[-1]`` tokens.
    """

    batch: tuple[int, ...]
    cache: tuple[int, ...]
    prompt: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("batch", "cache", "prompt"):
            b = tuple(int(x) for x in getattr(self, name))
            if not b or list(b) != sorted(set(b)) or b[0] < 1:
                raise ValueError(f"Buckets.{name} must be distinct positive sizes in ascending order, got {b}")
            object.__setattr__(self, name, b)
        if self.prompt[-1] != self.cache[-1]:
            raise ValueError(f"the largest prompt bucket ({self.prompt[-1]}) must be the context ({self.cache[-1]})")

    @classmethod
    def default(cls, max_batch: int, context: int, rows_multiple: int = 1) -> "Buckets":
        """Rows ``rows_multiple`` times powers of two up to ``max_batch`` (rounded up to a multiple of
        ``rows_multiple``, the data-parallel axis's size); cache lengths 256, 512, ... up to
        ``context``; prompt lengths 16, 32, ... up to ``context``."""
        if max_batch < 1 or context < 2 or rows_multiple < 1:
            raise ValueError(
                f"need max_batch >= 1, context >= 2 and rows_multiple >= 1, got {max_batch}, {context} and {rows_multiple}"
            )

        def upto(start: int, limit: int) -> tuple[int, ...]:
            out, b = [], start
            while b < limit:
                out.append(b)
                b *= 2
            return (*out, limit)

        prompts = tuple(b for b in PROMPT_BUCKETS if b < context) + (context,)
        rows = -(-max_batch // rows_multiple) * rows_multiple
        return cls(upto(rows_multiple, rows), upto(256, context) if context > 256 else (context,), prompts)

    @property
    def max_batch(self) -> int:
        return self.batch[-1]

    @property
    def context(self) -> int:
        return self.cache[-1]

    def batch_for(self, rows: int) -> int:
        return _fit(self.batch, rows)

    def cache_for(self, positions: int) -> int:
        return _fit(self.cache, positions)

    def prompt_for(self, length: int) -> int:
        return _fit(self.prompt, length)

    def neighbours(self, rows: int, cache_len: int) -> list[tuple[int, int]]:
        """The shapes one resize step away: the next batch bucket up or down, the same for cache."""
        out = []
        bi, ci = self.batch.index(rows), self.cache.index(cache_len)
        for j in (bi - 1, bi + 1):
            if 0 <= j < len(self.batch):
                out.append((self.batch[j], cache_len))
        for j in (ci - 1, ci + 1):
            if 0 <= j < len(self.cache):
                out.append((rows, self.cache[j]))
        return out


def key_data(seed: int) -> np.ndarray:
    """The threefry key data (uint32 ``[2]``) of a request's ``seed`` (any 64-bit integer)."""
    s = int(seed) & 0xFFFFFFFFFFFFFFFF
    return np.array([s >> 32, s & 0xFFFFFFFF], np.uint32)


def _choose(logits: jax.Array, keys: jax.Array, counters: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Each row's next token: greedy where its temperature is 0, else drawn with its own key
    (``keys`` uint32 ``[rows, 2]`` folded with ``counters [rows]``). Sampling runs only when some
    row samples."""
    chosen = greedy(logits)

    def draw() -> jax.Array:
        k = jax.vmap(lambda d, c: jax.random.fold_in(jax.random.wrap_key_data(d), c))(keys, counters)
        drawn = sample(logits, k, jnp.maximum(temperature, 1e-6), top_k, top_p)
        return jnp.where(temperature > 0, drawn, chosen)

    return lax.cond(jnp.any(temperature > 0), draw, lambda: chosen)


class Steps:
    """The engine's programs for a model and a set of buckets (see the module docstring).

    Args:
        lm: a :class:`~maxjax.models.CausalLM`.
        buckets: the shapes to compile.

    Every array the programs pass between them (caches, prefilled caches, decode tokens) is
    committed to the model's device, and :meth:`warmup` compiles for exactly that, so that a call
    never meets an argument placement it was not compiled for (JAX compiles again for a committed
    argument where it compiled for an uncommitted one). ``num_traces`` counts traces of the
    programs; :func:`compile_counter` counts compiles on the calling thread.
    """

    def __init__(self, lm: Any, buckets: Buckets):
        self.lm, self.buckets = lm, buckets
        fns = lm.functions
        self.functions = fns
        self.num_traces = 0
        options = lm.program.policy.compiler_options(lm.dtype.to_jax())
        if lm.mesh is None:
            leaf = jax.tree.leaves(lm.state)[0]
            #: where the engine's arrays live: the device of the model's weights, or replicated on its mesh
            self.sharding = jax.sharding.SingleDeviceSharding(next(iter(leaf.devices())))
            #: where its KV caches live (on a mesh: rows over dp and KV heads over tp, as the model's)
            self.cache_sharding = self.row_sharding = self.sharding
        else:
            from jax.sharding import NamedSharding, PartitionSpec as P

            self.sharding = NamedSharding(lm.mesh, P())
            cache = tuple(lm.functions.cache_shardings[0].spec)  # [layers, batch (dp), kv heads (tp), ...]
            cache = cache + (None,) * (5 - len(cache))
            self.cache_sharding = NamedSharding(lm.mesh, P(None, *cache[1:]))
            #: where a one-row cache (a prefilled prompt) lives: its row is not split over ``dp``
            self.row_sharding = NamedSharding(lm.mesh, P(None, None, *cache[2:]))
        if any(b % lm.batch_multiple for b in buckets.batch):
            raise ValueError(
                f"batch buckets {buckets.batch} must be multiples of the data-parallel axis's size {lm.batch_multiple}"
            )

        def counted(f: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                self.num_traces += 1
                return f(*args, **kwargs)

            wrapper.__name__ = f.__name__
            return wrapper

        def prefill(state, tokens, length, keys, temperature, top_k, top_p):
            kt, vt = fns.cache_shapes(1, tokens.shape[1])
            k, v = jnp.zeros(kt, fns.dtype), jnp.zeros(vt, fns.dtype)
            logits, k, v = fns.prefill(state, tokens, length, k, v)
            return _choose(logits, keys, jnp.zeros(1, jnp.int32), temperature, top_k, top_p), k, v

        def decode(state, tokens, positions, k, v, keys, counters, temperature, top_k, top_p):
            logits, k, v = fns.decode(state, tokens, positions, k, v)
            return _choose(logits, keys, counters, temperature, top_k, top_p), k, v

        def place(k1, v1, *, cache_len):  # [L, 1, H, D, bucket] -> [L, 1, H, D, cache_len]
            pad = cache_len - k1.shape[-1]
            return (
                jnp.pad(k1, [(0, 0)] * 4 + [(0, pad)]),
                jnp.pad(v1, [(0, 0)] * 3 + [(0, pad), (0, 0)]),
            )

        def insert(k, v, k1, v1, row):
            return lax.dynamic_update_slice(k, k1, (0, row, 0, 0, 0)), lax.dynamic_update_slice(v, v1, (0, row, 0, 0, 0))

        def move(k, v, src, dst):
            def one(c):
                r = lax.dynamic_slice_in_dim(c, src, 1, axis=1)
                return lax.dynamic_update_slice_in_dim(c, r, dst, axis=1)

            return one(k), one(v)

        def resize(k, v, *, rows, cache_len):
            kt, vt = fns.cache_shapes(rows, cache_len)
            cfg = lambda x, t: [(0, n - o, 0) for o, n in zip(x.shape, t)]  # noqa: E731  (negative: crop)
            return lax.pad(k, jnp.zeros((), k.dtype), cfg(k, kt)), lax.pad(v, jnp.zeros((), v.dtype), cfg(v, vt))

        def fresh(*, rows, cache_len):
            kt, vt = fns.cache_shapes(rows, cache_len)
            return jnp.zeros(kt, fns.dtype), jnp.zeros(vt, fns.dtype)

        # every output committed where the next program expects it: tokens with self.sharding, caches
        # with self.cache_sharding (one device, or a mesh)
        on, caches = self.sharding, (self.cache_sharding, self.cache_sharding)
        row = (self.row_sharding, self.row_sharding)
        jit = lambda f, **kw: jax.jit(counted(f), compiler_options=options, **kw)  # noqa: E731
        self._prefill = jit(prefill, out_shardings=(on, *row))
        self._decode = jit(decode, donate_argnums=(3, 4), out_shardings=(on, *caches))
        self._place = jit(place, static_argnames=("cache_len",), out_shardings=row)
        self._insert = jit(insert, donate_argnums=(0, 1), out_shardings=caches)
        self._move = jit(move, donate_argnums=(0, 1), out_shardings=caches)
        self._resize = jit(resize, static_argnames=("rows", "cache_len"), out_shardings=caches)
        self._fresh = jit(fresh, static_argnames=("rows", "cache_len"), out_shardings=caches)

    # -- running ------------------------------------------------------------------------------
    def prefill(self, tokens: np.ndarray, length: int, keys: np.ndarray, temperature: float, top_k: int, top_p: float):
        """``tokens`` int32 ``[1, bucket]`` (right-padded) of ``length`` -> (token int32 ``[1]``,
        k ``[L, 1, H, D, bucket]``, v ``[L, 1, H, bucket, D]``)."""
        return self._prefill(
            self.lm.state, tokens, np.array([length], np.int32), keys[None],
            np.array([temperature], np.float32), np.array([top_k], np.int32), np.array([top_p], np.float32),
        )  # fmt: skip

    def decode(self, tokens, positions, k, v, keys, counters, temperature, top_k, top_p):
        """One token per row -> (tokens, k, v). ``tokens`` int32 ``[rows]``: a host array, or the
        tokens of a decode step (on the device); the others host arrays ``[rows]`` (``keys``
        uint32 ``[rows, 2]``)."""
        if isinstance(tokens, np.ndarray):
            tokens = jax.device_put(tokens, self.sharding)
        return self._decode(self.lm.state, tokens, positions, k, v, keys, counters, temperature, top_k, top_p)

    def insert(self, k, v, k1, v1, row: int):
        """Writes a prefilled prompt's caches (any prompt bucket) into ``row``."""
        cache_len = k.shape[-1]
        if k1.shape[-1] != cache_len:
            k1, v1 = self._place(k1, v1, cache_len=cache_len)
        return self._insert(k, v, k1, v1, np.int32(row))

    def move(self, k, v, src: int, dst: int):
        """Copies row ``src`` over row ``dst``."""
        return self._move(k, v, np.int32(src), np.int32(dst))

    def resize(self, k, v, rows: int, cache_len: int):
        """The caches padded or cropped to ``(rows, cache_len)``, one neighbouring shape at a time."""
        b = self.buckets
        while k.shape[1] != rows or k.shape[-1] != cache_len:
            r, c = k.shape[1], k.shape[-1]
            if r != rows:
                r = b.batch[b.batch.index(r) + (1 if rows > r else -1)]
            else:
                c = b.cache[b.cache.index(c) + (1 if cache_len > c else -1)]
            k, v = self._resize(k, v, rows=r, cache_len=c)
        return k, v

    def fresh(self, rows: int, cache_len: int):
        """Zero caches of ``(rows, cache_len)``."""
        return self._fresh(rows=rows, cache_len=cache_len)

    # -- compiling ----------------------------------------------------------------------------
    def programs(self) -> list[tuple[str, Callable[[], Any]]]:
        """Every (name, compile thunk) :meth:`warmup` runs."""
        fns, b, state, on = self.functions, self.buckets, self.lm.state, self.sharding
        S = jax.ShapeDtypeStruct
        i32, f32, u32, dt = jnp.int32, jnp.float32, jnp.uint32, fns.dtype

        def caches(rows, cache_len, one_row=False):  # committed with the caches' sharding, as every cache is
            kt, vt = fns.cache_shapes(rows, cache_len)
            sh = self.row_sharding if one_row else self.cache_sharding
            return S(kt, dt, sharding=sh), S(vt, dt, sharding=sh)

        out: list[tuple[str, Callable[[], Any]]] = []
        for p in b.prompt:
            out.append((f"prefill[{p}]", lambda p=p: self._prefill.lower(
                state, S((1, p), i32), S((1,), i32), S((1, 2), u32), S((1,), f32), S((1,), i32), S((1,), f32))))  # fmt: skip
        for rows in b.batch:
            for c in b.cache:
                r1 = (S((rows,), i32),)
                out.append((f"decode[{rows}x{c}]", lambda rows=rows, c=c, r1=r1: self._decode.lower(
                    state, S((rows,), i32, sharding=on), *r1, *caches(rows, c), S((rows, 2), u32), *r1, S((rows,), f32), *r1,
                    S((rows,), f32))))  # fmt: skip
                out.append((f"insert[{rows}x{c}]", lambda rows=rows, c=c: self._insert.lower(
                    *caches(rows, c), *caches(1, c, one_row=True), S((), i32))))  # fmt: skip
                out.append((f"fresh[{rows}x{c}]", lambda rows=rows, c=c: self._fresh.lower(rows=rows, cache_len=c)))
                if rows > 1:
                    out.append((f"move[{rows}x{c}]", lambda rows=rows, c=c: self._move.lower(*caches(rows, c), S((), i32), S((), i32))))
                for r2, c2 in b.neighbours(rows, c):
                    out.append((f"resize[{rows}x{c}->{r2}x{c2}]", lambda rows=rows, c=c, r2=r2, c2=c2: self._resize.lower(
                        *caches(rows, c), rows=r2, cache_len=c2)))  # fmt: skip
        for c in b.cache:
            for p in b.prompt:
                if p < c:
                    out.append((f"place[{p}->{c}]", lambda p=p, c=c: self._place.lower(*caches(1, p, one_row=True), cache_len=c)))
        return out

    def warmup(self, progress: Callable[[str, int, int], None] | None = None, only: Iterable[str] | None = None) -> float:
        """Compiles every program (see :meth:`programs`); returns the seconds it took.

        ``progress(name, done, total)`` is called after each; ``only``: name prefixes to compile
        (e.g. ``["decode[1x"]``), for tests.
        """
        t0 = time.perf_counter()
        todo = self.programs()
        if only is not None:
            prefixes = tuple(only)
            todo = [(n, f) for n, f in todo if n.startswith(prefixes)]
        for i, (name, lower) in enumerate(todo):
            lower().compile()
            if progress is not None:
                progress(name, i + 1, len(todo))
        return time.perf_counter() - t0
