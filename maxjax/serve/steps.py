"""The serving engine's compiled programs, one per shape of a small fixed set (:class:`Buckets`).

The engine's KV cache is two arrays of :meth:`DecoderFunctions.cache_shapes` ``(rows, cache_len)``
whose ``rows`` is a batch bucket and ``cache_len`` a cache bucket; the programs are jitted around
the model's pure functions (:attr:`CausalLM.functions`) with the backend policy's compiler options
and the caches donated:

- ``prefill`` (per ``(rows, prompt bucket)``, rows one of :attr:`Steps.prefill_rows`): right-padded
  prompts ``[rows, bucket]`` prefilled together into caches of their own (``cache_len = bucket``),
  and each row's first token chosen with its own sampling parameters; more than one row only where
  ``rows x bucket`` fits the engine's prefill budget and the bucket is at most
  :attr:`Steps.BATCHED_PROMPT_MAX` (:attr:`Steps.prefill_shapes`);
- ``decode`` (per ``(rows, cache_len)``): one token for every row, each with its own sampling
  parameters and random stream (greedy where its temperature is 0);
- ``place`` (per ``(prefill rows, bucket, cache_len)``) and ``insert`` (per ``(prefill rows, rows,
  cache_len)``): prefilled prompts' caches padded to the engine's ``cache_len``, then each written
  into its row (one program for all of them: the target rows are an index array);
- ``resize`` (between neighbouring shapes), ``move`` (one row to another) and ``fresh`` (zero caches).

:meth:`Steps.warmup` compiles all of them, so that serving never compiles.

A request's random stream: the threefry key ``[seed >> 32, seed & 0xffffffff]`` (what
``jax.random.key(seed)`` gives with 64-bit mode on), folded with the index of the token being drawn.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from maxjax.models.generation import PROMPT_BUCKETS
from maxjax.models.sampling import greedy, sample

__all__ = ["Buckets", "Steps", "key_data"]


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
        prefill_budget: the engine's prefill budget (padded prompt tokens per scheduler turn): prompts
            are prefilled several at a time in the shapes ``(rows, bucket)`` with ``rows x bucket``
            within it (:attr:`prefill_shapes`); None: one at a time.

    Every array the programs pass between them (caches, prefilled caches, decode tokens) is
    committed to the model's device, and :meth:`warmup` compiles for exactly that, so that a call
    never meets an argument placement it was not compiled for (JAX compiles again for a committed
    argument where it compiled for an uncommitted one). ``num_traces`` counts traces of the
    programs; :func:`maxjax.engine.compiles.compile_counter` counts compiles on the calling thread.
    """

    #: the row counts a batched prefill is padded to (capped at the engine's ``max_batch``)
    PREFILL_ROWS = (1, 2, 4, 8)
    #: the largest prompt bucket prefilled several rows at a time: on a 2-core CPU (SmolLM2-135M
    #: Q4_1) a call of 2-8 rows took 1.1-2.7x less time per row than one-row calls up to bucket
    #: 128, and none less at 256 (where one row's matmuls are already large)
    BATCHED_PROMPT_MAX = 128

    def __init__(self, lm: Any, buckets: Buckets, prefill_budget: int | None = None):
        self.lm, self.buckets = lm, buckets
        top = min(self.PREFILL_ROWS[-1], buckets.max_batch)
        #: the row buckets of a prefill (ascending; 1 first)
        self.prefill_rows: tuple[int, ...] = tuple(r for r in self.PREFILL_ROWS if r < top) + (top,)
        #: every ``(rows, prompt bucket)`` a prefill is compiled for: one row for every bucket, more
        #: where ``rows x bucket <= prefill_budget`` and ``bucket <= BATCHED_PROMPT_MAX``
        self.prefill_shapes: tuple[tuple[int, int], ...] = tuple(
            (r, p) for r in self.prefill_rows for p in buckets.prompt
            if r == 1 or (prefill_budget is not None and r * p <= prefill_budget and p <= self.BATCHED_PROMPT_MAX)
        )  # fmt: skip
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
            #: where prefilled prompts' caches live: their rows are not split over ``dp``
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

        def prefill(state, tokens, lengths, keys, temperature, top_k, top_p):  # tokens [rows, bucket]
            n = tokens.shape[0]
            kt, vt = fns.cache_shapes(n, tokens.shape[1])
            k, v = jnp.zeros(kt, fns.dtype), jnp.zeros(vt, fns.dtype)
            logits, k, v = fns.prefill(state, tokens, lengths, k, v)  # logits [rows, vocab]
            return _choose(logits, keys, jnp.zeros(n, jnp.int32), temperature, top_k, top_p), k, v

        def decode(state, tokens, positions, k, v, keys, counters, temperature, top_k, top_p):
            logits, k, v = fns.decode(state, tokens, positions, k, v)
            return _choose(logits, keys, counters, temperature, top_k, top_p), k, v

        def place(k1, v1, *, cache_len):  # [L, n, H, D, bucket] -> [L, n, H, D, cache_len]
            pad = cache_len - k1.shape[-1]
            return (
                jnp.pad(k1, [(0, 0)] * 4 + [(0, pad)]),
                jnp.pad(v1, [(0, 0)] * 3 + [(0, pad), (0, 0)]),
            )

        def insert(k, v, k1, v1, rows):  # k1 [L, n, H, D, cache_len] into k [L, R, H, D, cache_len] at rows [n]
            if k1.shape[1] == 1:  # one row: a slice update (the program of a one-prompt admission)
                at = (0, rows[0], 0, 0, 0)
                return lax.dynamic_update_slice(k, k1, at), lax.dynamic_update_slice(v, v1, at)
            # several: one scatter; a padding row's index is R (out of range): dropped
            return k.at[:, rows].set(k1, mode="drop"), v.at[:, rows].set(v1, mode="drop")

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
    def prefill(self, tokens: np.ndarray, lengths: np.ndarray, keys: np.ndarray, temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray):
        """``tokens`` int32 ``[n, bucket]`` (right-padded rows, ``(n, bucket)`` one of
        :attr:`prefill_shapes`) of ``lengths`` int32 ``[n]``, each row sampled with its own ``keys``
        uint32 ``[n, 2]``, ``temperature`` float32, ``top_k`` int32 and ``top_p`` float32 ``[n]`` ->
        (tokens int32 ``[n]``, k ``[L, n, H, D, bucket]``, v ``[L, n, H, bucket, D]``)."""
        return self._prefill(self.lm.state, tokens, lengths, keys, temperature, top_k, top_p)

    def decode(self, tokens, positions, k, v, keys, counters, temperature, top_k, top_p):
        """One token per row -> (tokens, k, v). ``tokens`` int32 ``[rows]``: a host array, or the
        tokens of a decode step (on the device); the others host arrays ``[rows]`` (``keys``
        uint32 ``[rows, 2]``)."""
        if isinstance(tokens, np.ndarray):
            tokens = jax.device_put(tokens, self.sharding)
        return self._decode(self.lm.state, tokens, positions, k, v, keys, counters, temperature, top_k, top_p)

    def insert(self, k, v, k1, v1, rows: np.ndarray):
        """Writes prefilled prompts' caches (``n`` rows, any prompt bucket) into the cache rows
        ``rows`` int32 ``[n]`` (a padding row's index: the cache's row count, dropped)."""
        cache_len = k.shape[-1]
        if k1.shape[-1] != cache_len:
            k1, v1 = self._place(k1, v1, cache_len=cache_len)
        return self._insert(k, v, k1, v1, np.asarray(rows, np.int32))

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
        for n, p in self.prefill_shapes:
            out.append((f"prefill[{n}x{p}]", lambda n=n, p=p: self._prefill.lower(
                state, S((n, p), i32), S((n,), i32), S((n, 2), u32), S((n,), f32), S((n,), i32), S((n,), f32))))  # fmt: skip
        for rows in b.batch:
            for c in b.cache:
                r1 = (S((rows,), i32),)
                out.append((f"decode[{rows}x{c}]", lambda rows=rows, c=c, r1=r1: self._decode.lower(
                    state, S((rows,), i32, sharding=on), *r1, *caches(rows, c), S((rows, 2), u32), *r1, S((rows,), f32), *r1,
                    S((rows,), f32))))  # fmt: skip
                for n in self.prefill_rows:
                    if n <= rows:
                        out.append((f"insert[{n}->{rows}x{c}]", lambda n=n, rows=rows, c=c: self._insert.lower(
                            *caches(rows, c), *caches(n, c, one_row=True), S((n,), i32))))  # fmt: skip
                out.append((f"fresh[{rows}x{c}]", lambda rows=rows, c=c: self._fresh.lower(rows=rows, cache_len=c)))
                if rows > 1:
                    out.append((f"move[{rows}x{c}]", lambda rows=rows, c=c: self._move.lower(*caches(rows, c), S((), i32), S((), i32))))
                for r2, c2 in b.neighbours(rows, c):
                    out.append((f"resize[{rows}x{c}->{r2}x{c2}]", lambda rows=rows, c=c, r2=r2, c2=c2: self._resize.lower(
                        *caches(rows, c), rows=r2, cache_len=c2)))  # fmt: skip
        for c in b.cache:
            for n, p in self.prefill_shapes:
                if p < c:
                    out.append((f"place[{n}x{p}->{c}]", lambda n=n, p=p, c=c: self._place.lower(
                        *caches(n, p, one_row=True), cache_len=c)))  # fmt: skip
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
