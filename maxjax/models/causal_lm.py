"""Serving a decoder language model: load, compile ``prefill``/``decode_step``, generate text.

    from maxjax.models import load_model
    lm = load_model()                                   # the bundled SmolLM2 GGUF
    [out] = lm.generate(["The quick brown fox"], max_new_tokens=32)
    print(out.text)

How it runs: the model (:class:`maxjax.nn.Transformer`) is traced once into a graph with symbolic
``batch``/``seq``/``cache_len`` dims and wrapped in a :class:`maxjax.engine.Program` (its 30
layers run as one ``lax.scan``). One ``jax.jit`` step function runs the program and samples the
next token. Prompts are right-padded to a few length buckets (so a new prompt length rarely
compiles), batches of prompts of different lengths prefill together, and decoding runs one token
for every row per step with the KV cache donated (updated in place). Each distinct
(batch, bucket, cache size) compiles once; decoding never recompiles per token.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.dtype import DType
from maxjax.engine import Program
from maxjax.graph import Graph, TensorType
from maxjax.models.llama import LlamaConfig, build_llama
from maxjax.models.sampling import greedy, sample

__all__ = ["CausalLM", "Generation", "load_model", "resolve_model_path"]

PROMPT_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
CACHE_ROUND = 128


@dataclass
class Generation:
    """One prompt's result: the new token ids and text, and how long it took.

    ``time_to_first_token`` is seconds from the start of the batch to its first sampled token
    (compiling the prefill, when this shape is new, included); ``decode_seconds`` is the time spent
    in decode steps after that, less ``compile_seconds`` of them; ``compile_seconds`` is the time
    this call spent compiling (0 once every shape it needs has been compiled).
    """

    prompt: str
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"
    time_to_first_token: float = 0.0
    decode_seconds: float = 0.0
    compile_seconds: float = 0.0

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


class CausalLM:
    """A decoder LM ready to generate: tokenizer, module, compiled program and prepared weights.

    Use :func:`load_model` (or :meth:`from_gguf` / :meth:`from_pretrained_dir`) to make one.

    Args:
        module: the :class:`~maxjax.nn.Transformer` with its weights loaded.
        config: its :class:`LlamaConfig`.
        tokenizer: a :class:`maxjax.tokenizer.Tokenizer`.
        dtype: activation and KV-cache dtype (float32 default; bfloat16 allowed).
        progress: show a progress bar while the weights are placed on the device.
        quantized_layout: how quantized weights are kept (see :class:`maxjax.engine.Program`):
            ``"nibbles"`` (default: 4-bit weights stay 4 bits with their block scales, the file's
            size for Q4_0/Q4_1; other encodings one byte per value), ``"unpacked"`` (one byte per
            value plus float32 block scales: about 2x the memory of Q4_1, no faster on CPU),
            ``"packed"`` (the file's blocks as they are; slow on CPU) or ``"dequantized"``
            (float32). All give the same weights, bit for bit.
    """

    def __init__(
        self,
        module: Any,
        config: LlamaConfig,
        tokenizer: Any,
        dtype: DType = DType.float32,
        progress: bool = False,
        source: str = "",
        quantized_layout: str | None = None,
        policy: Any = None,
    ):
        self.module, self.config, self.tokenizer, self.dtype, self.source = module, config, tokenizer, dtype, source
        keys, values = self.cache_shapes("batch", "cache_len")
        types = [
            TensorType(DType.int32, ["batch", "seq"]),
            TensorType(DType.int32, ["batch", "seq"]),
            TensorType(dtype, keys),
            TensorType(dtype, values),
            TensorType(DType.int32, ["batch"]),
        ]
        self.graph = Graph("causal_lm", forward=module, input_types=types)
        self.program = Program(self.graph, quantized_layout=quantized_layout, policy=policy)
        bar = _progress_bar(len(self.graph._weights), "loading weights") if progress else None
        try:
            self.state = self.program.prepare(module.state_dict(), progress=(lambda name: bar.update(1)) if bar else None)
        finally:
            if bar is not None:
                bar.close()
        self.num_compiles = 0
        self._default_key = jax.random.key(0)  # the key argument of greedy steps (unused by them)
        program = self.program

        def step(state, tokens, positions, k_cache, v_cache, last_index, key, temperature, top_k, top_p, *, do_sample):
            self.num_compiles += 1  # runs once per trace, i.e. per compilation
            logits, k_cache, v_cache = program.apply(state, tokens, positions, k_cache, v_cache, last_index)
            nxt = sample(logits, key, temperature, top_k, top_p) if do_sample else greedy(logits)
            return nxt, logits, k_cache, v_cache

        # the backend policy's compiler options: per program, nothing global changes
        options = self.program.policy.compiler_options(dtype.to_jax())
        self._step = jax.jit(step, static_argnames=("do_sample",), donate_argnums=(3, 4), compiler_options=options)

    # -- loading ---------------------------------------------------------------------------------
    @classmethod
    def from_gguf(
        cls, path: str | os.PathLike[str], dtype: DType = DType.float32, progress: bool = False, quantized_layout: str | None = None
    ) -> "CausalLM":
        """Loads a llama-architecture GGUF: weights (packed as in the file), config and tokenizer.

        Raises:
            ValueError: an unsupported architecture (naming it and the supported ones), or a file
                that cannot be read.
        """
        from maxjax.graph.weights import GGUFWeights
        from maxjax.graph.weights.adapters import llama_from_gguf
        from maxjax.tokenizer import Tokenizer

        weights = GGUFWeights(path)
        meta = weights.metadata
        config = LlamaConfig.from_gguf_metadata(meta, weights.output.weight.exists(), source=str(path))
        if weights["rope_freqs"]["weight"].exists():
            raise ValueError(f"{path}: Llama 3 rope frequency scaling (rope_freqs.weight) is not supported")
        state = llama_from_gguf(weights)
        module = build_llama(config, dtype)
        module.load_state_dict(state, override_quantization_encoding=True, weight_alignment=1)
        return cls(module, config, Tokenizer.from_gguf(weights.reader), dtype, progress, str(path), quantized_layout)

    @classmethod
    def from_pretrained_dir(
        cls, directory: str | os.PathLike[str], dtype: DType = DType.float32, progress: bool = False, quantized_layout: str | None = None
    ) -> "CausalLM":
        """Loads a Hugging Face llama directory: ``config.json``, ``*.safetensors``, ``tokenizer.json``.

        Raises:
            ValueError: a missing ``config.json`` or an unsupported architecture.
        """
        from maxjax.graph.weights import load_weights
        from maxjax.graph.weights.adapters import llama_from_hf
        from maxjax.tokenizer import Tokenizer

        d = Path(directory)
        cfg_path = d / "config.json"
        if not cfg_path.is_file():
            raise ValueError(f"{d}: no config.json (a Hugging Face model directory needs one)")
        config = LlamaConfig.from_hf_config(json.loads(cfg_path.read_text()), source=str(cfg_path))
        files = sorted(str(p) for p in d.glob("*.safetensors"))
        if not files:
            raise ValueError(f"{d}: no *.safetensors files")
        state = llama_from_hf(load_weights(files))
        module = build_llama(config, dtype)
        module.load_state_dict(state, weight_alignment=1)
        return cls(module, config, Tokenizer.from_pretrained_dir(d), dtype, progress, str(d), quantized_layout)

    # -- running ---------------------------------------------------------------------------------
    def cache_shapes(self, batch: Any, cache_len: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """Shapes of the caches: keys ``[n_layers, batch, n_kv_heads, head_dim, cache_len]``
        (transposed, see :mod:`maxjax.nn.attention`) and values ``[n_layers, batch, n_kv_heads,
        cache_len, head_dim]``; ``batch`` and ``cache_len`` are ints or symbolic dimension names."""
        c = self.config
        keys = (c.num_hidden_layers, batch, c.num_key_value_heads, c.head_dim, cache_len)
        values = (c.num_hidden_layers, batch, c.num_key_value_heads, cache_len, c.head_dim)
        return keys, values

    def new_cache(self, batch: int, cache_len: int) -> tuple[jax.Array, jax.Array]:
        """Zero key and value caches of :meth:`cache_shapes`."""
        keys, values = self.cache_shapes(batch, cache_len)
        return jnp.zeros(keys, self.dtype.to_jax()), jnp.zeros(values, self.dtype.to_jax())

    def prefill(self, tokens: np.ndarray, lengths: Sequence[int], k_cache: Any, v_cache: Any, key: Any = None, **sampling: Any) -> tuple[Any, Any, Any, Any]:
        """Runs right-padded prompts ``tokens [batch, bucket]`` of ``lengths``; returns
        ``(next_tokens [batch], last-position logits [batch, vocab], k_cache, v_cache)``."""
        b, s = tokens.shape
        positions = np.broadcast_to(np.arange(s, dtype=np.int32), (b, s))
        last = np.asarray(lengths, np.int32) - 1
        return self._run(tokens, positions, k_cache, v_cache, last, key, **sampling)

    def decode_step(self, tokens: Any, positions: Any, k_cache: Any, v_cache: Any, key: Any = None, **sampling: Any) -> tuple[Any, Any, Any, Any]:
        """One token per row at ``positions [batch]``; returns like :meth:`prefill`."""
        b = tokens.shape[0]
        return self._run(
            jnp.reshape(tokens, (b, 1)), jnp.reshape(positions, (b, 1)), k_cache, v_cache, np.zeros(b, np.int32), key, **sampling
        )

    def _run(self, tokens, positions, k_cache, v_cache, last, key, temperature=0.0, top_k=0, top_p=1.0):
        do_sample = temperature > 0
        if key is None:
            key = self._default_key
        return self._step(
            self.state, tokens, positions, k_cache, v_cache, last, key,
            np.float32(max(temperature, 1e-6)), np.int32(top_k), np.float32(top_p), do_sample=do_sample,
        )  # fmt: skip

    def encode_prompt(self, prompt: str, chat: bool = False) -> list[int]:
        """Token ids of ``prompt`` (through the chat template when ``chat``; no BOS unless the
        model asks for one).

        Raises:
            ValueError: an empty prompt.
        """
        if not prompt:
            raise ValueError("the prompt is empty")
        if chat:
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
            return self.tokenizer.encode(text, add_special_tokens=False)
        return self.tokenizer.encode(prompt, add_special_tokens=self.tokenizer.add_bos_token)

    def generate(
        self,
        prompts: Sequence[str],
        max_new_tokens: int = 64,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        chat: bool = False,
        stop_at_eos: bool = True,
        on_token: Callable[[int, int], None] | None = None,
    ) -> list[Generation]:
        """Generates up to ``max_new_tokens`` for each prompt, all in one batch.

        Args:
            temperature: 0 for greedy decoding, else sampling with ``top_k`` (0: off) and
                ``top_p`` (1: off) from ``jax.random.key(seed)``.
            chat: render each prompt as a user message through the model's chat template.
            stop_at_eos: a row stops at an end-of-generation token (not included in its text).
            on_token: called as ``on_token(row, token_id)`` for each new token, as soon as it exists.

        Raises:
            ValueError: no prompts, an empty prompt, ``max_new_tokens < 1``, or a prompt that
                with the new tokens does not fit the model's context.
        """
        _check_request(len(prompts), max_new_tokens)
        start = time.perf_counter()
        ids = [self.encode_prompt(p, chat) for p in prompts]
        return self._generate(
            ids, list(prompts), max_new_tokens, start, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
            stop_at_eos=stop_at_eos, on_token=on_token,
        )  # fmt: skip

    def generate_tokens(
        self,
        token_ids: Sequence[Sequence[int]],
        max_new_tokens: int = 64,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        stop_at_eos: bool = True,
        on_token: Callable[[int, int], None] | None = None,
    ) -> list[Generation]:
        """:meth:`generate` from prompts already tokenized: ``token_ids`` is one list of ids per row.

        Raises:
            ValueError: no rows, an empty row, an id outside the vocabulary, ``max_new_tokens < 1``,
                or a row that with the new tokens does not fit the model's context.
        """
        _check_request(len(token_ids), max_new_tokens)
        start = time.perf_counter()
        ids = [[int(t) for t in row] for row in token_ids]
        vocab = self.config.vocab_size
        for r, row in enumerate(ids):
            if not row:
                raise ValueError(f"row {r}: the prompt is empty")
            bad = [t for t in row if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"row {r}: token id {bad[0]} is outside the vocabulary [0, {vocab})")
        return self._generate(
            ids, [""] * len(ids), max_new_tokens, start, temperature=temperature, top_k=top_k, top_p=top_p,
            seed=seed, stop_at_eos=stop_at_eos, on_token=on_token,
        )  # fmt: skip

    def _generate(self, ids, prompts, max_new_tokens, start, *, temperature, top_k, top_p, seed, stop_at_eos, on_token):
        context = self.config.max_position_embeddings
        longest = max(len(i) for i in ids)
        if longest + max_new_tokens > context:
            raise ValueError(
                f"the prompt ({longest} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the model's "
                f"context of {context} tokens"
            )
        b = len(ids)
        bucket = _bucket(longest, context)
        cache_len = min(context, -(-(bucket + max_new_tokens) // CACHE_ROUND) * CACHE_ROUND)
        tokens = np.zeros((b, bucket), np.int32)
        for r, row in enumerate(ids):
            tokens[r, : len(row)] = row
        lengths = np.array([len(r) for r in ids], np.int32)
        k_cache, v_cache = self.new_cache(b, cache_len)
        sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        do_sample = temperature > 0
        key = sub = jax.random.key(seed)
        if do_sample:
            key, sub = jax.random.split(key)
        compile_s = 0.0

        def timed(call: Callable[[], Any]) -> Any:  # a call that compiles adds its time to compile_s
            nonlocal compile_s
            n0, t0 = self.num_compiles, time.perf_counter()
            out = call()  # jit dispatch returns once compiled, before the device has run it
            if self.num_compiles != n0:
                compile_s += time.perf_counter() - t0
            return out

        nxt, _, k_cache, v_cache = timed(lambda: self.prefill(tokens, lengths, k_cache, v_cache, sub, **sampling))
        eos = self.tokenizer.eos_token_ids if stop_at_eos else frozenset()
        results = [Generation(p, i) for p, i in zip(prompts, ids)]
        done = np.zeros(b, bool)
        positions = lengths.copy()

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
            return (*self.decode_step(tokens, positions, k_cache, v_cache, sub, **sampling), key)

        host = np.asarray(nxt)
        first = time.perf_counter() - start
        emit(host)  # the first tokens go out before the first decode step (and its compile)
        prefill_compile_s = compile_s
        if not done.all() and max_new_tokens > 1:
            nxt, _, k_cache, v_cache, key = timed(lambda: step(nxt, positions, k_cache, v_cache, key))
            positions = positions + 1
            for n in range(2, max_new_tokens + 1):
                # The device makes token n + 1 while the host reads token n: the next step is
                # dispatched on the device-resident tokens before they are copied to the host (a
                # row that has just ended computes one token more, which is dropped).
                pending = step(nxt, positions, k_cache, v_cache, key) if n < max_new_tokens else None
                positions = positions + 1
                emit(np.asarray(nxt))
                if pending is None or done.all():
                    break
                nxt, _, k_cache, v_cache, key = pending
        total = time.perf_counter() - start
        for r in results:
            r.text = self.tokenizer.decode(r.token_ids)
            r.time_to_first_token = first
            r.decode_seconds = total - first - (compile_s - prefill_compile_s)
            r.compile_seconds = compile_s
        return results

    def stream(self, prompt: str, max_new_tokens: int = 64, **kwargs: Any) -> Iterator[str]:
        """Yields the text of ``prompt``'s continuation piece by piece, as tokens are made.

        Runs :meth:`generate` on a worker thread; the pieces joined equal ``generate(...).text``.
        The final :class:`Generation` is available as ``self.last_generation`` afterwards.
        """
        import queue
        import threading

        q: queue.Queue[Any] = queue.Queue()
        detok = self.tokenizer.incremental_detokenizer()
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["result"] = self.generate([prompt], max_new_tokens, on_token=lambda r, t: q.put(t), **kwargs)[0]
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
        self.last_generation = box["result"]


def _check_request(rows: int, max_new_tokens: int) -> None:
    """The checks ``generate`` and ``generate_tokens`` share: some rows, at least one new token."""
    if not rows:
        raise ValueError("no prompts given")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")


def _progress_bar(total: int, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="weight", leave=False)


def resolve_model_path(model: str | os.PathLike[str] | None) -> Path:
    """The file or directory for ``model``: None (the bundled SmolLM2 GGUF), a GGUF file, a model
    directory, or a Hugging Face repo id found in the local Hugging Face cache.

    Raises:
        FileNotFoundError: nothing by that name (the message says where it looked).
    """
    from maxjax._bundled import smollm2_gguf_path

    if model is None:
        return smollm2_gguf_path()
    p = Path(model).expanduser()
    if p.exists():
        return p
    text = str(model)
    if text.count("/") == 1 and not text.startswith((".", "/")):
        hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
        repo = hub / ("models--" + text.replace("/", "--"))
        snapshots = sorted((repo / "snapshots").glob("*"), key=lambda s: s.stat().st_mtime) if repo.is_dir() else []
        for snap in reversed(snapshots):
            if (snap / "config.json").exists() or list(snap.glob("*.gguf")):
                return snap
        raise FileNotFoundError(f"model {text!r}: not a file or directory, and not in the Hugging Face cache at {hub}")
    raise FileNotFoundError(f"model {text!r}: no such file or directory")


def load_model(
    model: str | os.PathLike[str] | None = None,
    *,
    dtype: DType = DType.float32,
    progress: bool = False,
    quantized_layout: str | None = None,
) -> CausalLM:
    """Loads a model for generation: a GGUF file, a Hugging Face directory (or repo id in the local
    cache), or with no argument the bundled SmolLM2-135M-Instruct (Q4_1 GGUF).

    ``quantized_layout`` is how a GGUF's quantized weights are kept in memory (see
    :class:`CausalLM`): ``"nibbles"`` (default, 4-bit stays 4-bit), ``"unpacked"`` (one byte per
    value), ``"packed"``, ``"dequantized"``.

    Raises:
        FileNotFoundError: no such model.
        ValueError: an unknown format or an unsupported architecture.
    """
    path = resolve_model_path(model)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if (path / "config.json").exists():
            return CausalLM.from_pretrained_dir(path, dtype, progress, quantized_layout)
        if len(ggufs) == 1:
            path = ggufs[0]
        else:
            raise ValueError(f"{path}: neither a Hugging Face model directory (config.json) nor a folder with one .gguf")
    from maxjax.graph.weights import WeightsFormat, weights_format

    fmt = weights_format([path])
    if fmt is not WeightsFormat.gguf:
        raise ValueError(f"{path}: a {fmt.value} file alone cannot be generated from; pass its model directory")
    return CausalLM.from_gguf(path, dtype, progress, quantized_layout)
