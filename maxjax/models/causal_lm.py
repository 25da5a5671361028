"""``CausalLM``: a decoder LM ready to generate (module, tokenizer, compiled program, placed weights).

    from maxjax.models import load_model
    lm = load_model()                                   # the bundled SmolLM2 GGUF
    [out] = lm.generate(["The quick brown fox"], max_new_tokens=32)
    print(out.text)

How it runs: the architecture's module (found in :mod:`maxjax.models.registry`) is traced once
into a graph with symbolic ``batch``/``seq``/``cache_len`` dims and wrapped in a
:class:`maxjax.engine.Program` (its layers run as one ``lax.scan``). The pure functions of that
program are :attr:`CausalLM.functions` (:class:`~maxjax.models.decoding.DecoderFunctions`); maxjax
jits one step of its own around them, forward pass plus next-token choice, with the backend
policy's compiler options and the KV cache donated (updated in place). Each distinct (batch,
prompt bucket, cache size) compiles once; decoding never recompiles per token. The generation loop
is :mod:`maxjax.models.generation`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import jax
import numpy as np

from maxjax.backend.cpu import release_freed_heap
from maxjax.dtype import DType
from maxjax.engine import Program
from maxjax.graph import Graph, TensorType
from maxjax.graph.quantization import MappedArray, QuantizedArray
from maxjax.graph.weights.gguf import forget_reader
from maxjax.models import generation
from maxjax.models.decoding import DecoderFunctions, cache_shapes
from maxjax.models.generation import Generation
from maxjax.models import checkpoint
from maxjax.models.sampling import check_sampling, greedy, sample

__all__ = ["CausalLM", "Generation"]


class CausalLM:
    """A decoder LM ready to generate: tokenizer, module, compiled program and prepared weights.

    Use :func:`~maxjax.models.load_model` (or :meth:`from_gguf` / :meth:`from_pretrained_dir`).

    Args:
        module: the model module with its weights loaded (called as ``module(tokens, positions,
            k_cache, v_cache, last_index) -> (logits, k_cache, v_cache)``).
        config: its config (``vocab_size``, ``num_hidden_layers``, ``num_key_value_heads``,
            ``head_dim``, ``max_position_embeddings``).
        tokenizer: a :class:`maxjax.tokenizer.Tokenizer`.
        dtype: activation and KV-cache dtype (float32 default; bfloat16 allowed), and that of a Hugging
            Face checkpoint's float weights (a bfloat16 file loaded in bfloat16 keeps its weights as
            they are: half float32's memory).
        progress: show a progress bar while the weights are placed on the device.
        source: where the model came from (for messages).
        quantized_layout: how quantized weights are kept (a layout of
            :mod:`maxjax.graph.quantization`: ``"nibbles"``, ``"unpacked"``, ``"packed"``,
            ``"dequantized"``); None: the backend policy's choice for the platform and CPU. All
            give the same weights, bit for bit.
        policy: the :class:`~maxjax.backend.BackendPolicy` (None: JAX's default backend's).
        mesh: a ``jax.sharding.Mesh`` to run on: tensor parallel over its ``tp`` axis (the
            module's ``sharding_strategy = tensor_parallel(n)``: attention heads and their KV cache,
            the MLP, the vocabulary of the embedding and head) and data parallel over ``dp`` (the
            batch and its KV cache). Either axis may be missing or of size 1.
        mesh_axes: the names of the data- and tensor-parallel axes (default ``("dp", "tp")``).

    Raises:
        ValueError: a mesh axis that does not exist, or a module that cannot be split over it.
    """

    def __init__(
        self,
        module: Any,
        config: Any,
        tokenizer: Any,
        dtype: DType = DType.float32,
        progress: bool = False,
        source: str = "",
        quantized_layout: str | None = None,
        policy: Any = None,
        mesh: Any = None,
        mesh_axes: tuple[str, str] = ("dp", "tp"),
    ):
        self.module, self.config, self.tokenizer, self.dtype, self.source = module, config, tokenizer, dtype, source
        self.mesh, self.mesh_axes = _prepare_mesh(module, mesh, mesh_axes)
        kv_heads = getattr(module, "kv_cache_heads", None)
        keys, values = cache_shapes(config, "batch", "cache_len", kv_heads)
        types = [
            TensorType(DType.int32, ["batch", "seq"]),
            TensorType(DType.int32, ["batch", "seq"]),
            TensorType(dtype, keys),
            TensorType(dtype, values),
            TensorType(DType.int32, ["batch"]),
        ]
        self.graph = Graph("causal_lm", forward=module, input_types=types)
        devices = list(self.mesh.devices.flat) if self.mesh is not None else None
        self.program = Program(self.graph, quantized_layout=quantized_layout, policy=policy, devices=devices)
        shard = self._batch_shardings()
        #: the pure functions of (state, inputs) for users' own jits (see maxjax.models.decoding)
        self.functions = DecoderFunctions(
            self.program, config, dtype.to_jax(), kv_heads, None if shard is None else (shard["cache"], shard["cache"])
        )
        bar = _progress_bar(len(self.graph._weights), "loading weights") if progress else None
        try:
            self.state = self.program.prepare(module.state_dict(), progress=(lambda name: bar.update(1)) if bar else None)
        finally:
            if bar is not None:
                bar.close()
        leaves = jax.tree_util.tree_leaves(self.state, is_leaf=lambda x: isinstance(x, QuantizedArray))
        mapped = sum(int(x.nbytes) for x in leaves if isinstance(x, MappedArray))
        #: most of the weights' bytes are read in place from a mapped file (the ``mapped`` layout):
        #: not resident until a product first reads them
        self.weights_mapped = 2 * mapped > sum(int(x.nbytes) for x in leaves)
        self.num_compiles = 0
        self._decode_compiled: set[tuple[int, int, bool]] = set()  # (rows, cache_len, do_sample) by compile_decode
        # the key argument of greedy steps (unused by them): a key of the default PRNG wrapped from
        # zeros, since jax.random.key(0) compiles a program at its first call (0.07 s of a load)
        key_shape = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))).shape
        self._default_key = jax.random.wrap_key_data(np.zeros(key_shape, np.uint32))
        forward = self.functions.forward

        def step(state, tokens, positions, k_cache, v_cache, last_index, key, temperature, top_k, top_p, do_sample):
            self.num_compiles += 1  # runs once per trace, i.e. per compilation
            logits, k_cache, v_cache = forward(state, tokens, positions, k_cache, v_cache, last_index)
            nxt = sample(logits, key, temperature, top_k, top_p) if do_sample else greedy(logits)
            return nxt, logits, k_cache, v_cache

        options = self.program.policy.compiler_options(dtype.to_jax())  # per program: nothing global changes
        shardings = {}
        if shard is not None:  # explicit in/out shardings on a mesh: the batch over dp, heads over tp
            state_sh = self.program.shardings(self.state)
            rep = shard["replicated"]
            shardings = dict(  # the next tokens and logits replicated: every process reads them
                in_shardings=(state_sh, shard["rows"], shard["rows"], shard["cache"], shard["cache"], shard["batch"], rep, rep, rep, rep),
                out_shardings=(rep, rep, shard["cache"], shard["cache"]),
            )  # fmt: skip
        self._step = jax.jit(step, static_argnums=10, donate_argnums=(3, 4), compiler_options=options, **shardings)

    def release_freed_heap(self) -> None:
        """Gives the heap memory the process has freed back to the system where the policy says
        so (its ``release_freed_heap``; called after a load, after each compile of this
        model's programs and at the end of a generation, see
        :func:`maxjax.backend.cpu.release_freed_heap`)."""
        if self.program.policy.release_freed_heap:
            release_freed_heap()

    @property
    def batch_multiple(self) -> int:
        """Batches run in multiples of this many rows (the data-parallel axis's size)."""
        if self.mesh is None or self.mesh_axes[0] not in self.mesh.axis_names:
            return 1
        return int(self.mesh.shape[self.mesh_axes[0]])

    def _batch_shardings(self) -> dict[str, Any] | None:
        if self.mesh is None:
            return None
        from jax.sharding import NamedSharding, PartitionSpec as P

        names = self.mesh.axis_names
        dp = self.mesh_axes[0] if self.mesh_axes[0] in names else None
        tp = self.mesh_axes[1] if self.mesh_axes[1] in names else None
        kv = self.functions_kv_heads
        if tp is not None and (self.mesh.shape[tp] == 1 or kv % self.mesh.shape[tp]):
            tp = None  # a replicated model (tp of 1 or no strategy) keeps the cache's heads whole
        return {
            "rows": NamedSharding(self.mesh, P(dp, None)),
            "batch": NamedSharding(self.mesh, P(dp)),
            "cache": NamedSharding(self.mesh, P(None, dp, tp, None, None)),
            "replicated": NamedSharding(self.mesh, P()),
        }

    @property
    def functions_kv_heads(self) -> int:
        kv = getattr(self.module, "kv_cache_heads", None)
        return self.config.num_key_value_heads if kv is None else int(kv)

    # -- loading ---------------------------------------------------------------------------------
    @classmethod
    def from_gguf(
        cls,
        path: str | os.PathLike[str],
        dtype: DType = DType.float32,
        progress: bool = False,
        quantized_layout: str | None = None,
        policy: Any = None,
        mesh: Any = None,
        mesh_axes: tuple[str, str] = ("dp", "tp"),
    ) -> "CausalLM":
        """Loads a GGUF of a registered architecture: weights (packed as in the file; F16/BF16
        matrices kept as they are where the policy's ``keep_16bit_weights`` holds, else widened
        to float32), config and tokenizer.

        Raises:
            ValueError: an unsupported architecture (naming it and the supported ones), or a file
                that cannot be read.
        """
        from concurrent.futures import ThreadPoolExecutor

        from maxjax.tokenizer import Tokenizer

        arch, config, weights = checkpoint.open_gguf_checkpoint(path, lazy=True)  # read once, when placed (a mesh: each process its shards)
        # The tokenizer is built on a second thread while the weights are placed: its Python work
        # (0.4 s for a 128k vocabulary) overlaps their copies and conversions, which release the
        # GIL. Its errors still come first, as when it was built before anything else.
        with ThreadPoolExecutor(1, thread_name_prefix="maxjax-tokenizer") as pool:
            building = pool.submit(Tokenizer.from_gguf, weights.reader)
            try:
                state = checkpoint.kept_16bit_weights(arch.weights_from_gguf(weights, config), policy, mesh, dtype)  # F16/BF16 matrices
                module = checkpoint.build(arch, config, state, dtype, quantized=True)
                lm = cls(module, config, None, dtype, progress, str(path), quantized_layout, policy, mesh, mesh_axes)
            except BaseException:
                error = building.exception()  # waits for the tokenizer
                if error is not None:
                    raise error from None
                raise
            lm.tokenizer = building.result()
        forget_reader(path)  # the model holds its weights and tokenizer: the parsed metadata can go
        lm.release_freed_heap()  # what the build, the placement and the tokenizer freed
        return lm

    @classmethod
    def from_pretrained_dir(
        cls,
        directory: str | os.PathLike[str],
        dtype: DType = DType.float32,
        progress: bool = False,
        quantized_layout: str | None = None,
        policy: Any = None,
        mesh: Any = None,
        mesh_axes: tuple[str, str] = ("dp", "tp"),
    ) -> "CausalLM":
        """Loads a Hugging Face model directory: ``config.json``, ``*.safetensors``, ``tokenizer.json``.

        Raises:
            ValueError: a missing ``config.json``, no safetensors, or an unsupported architecture.
        """
        from maxjax.tokenizer import Tokenizer

        arch, config, state = checkpoint.open_hf_checkpoint(directory, lazy=True, dtype=dtype, policy=policy, mesh=mesh)  # read once, when placed
        tokenizer = Tokenizer.from_pretrained_dir(Path(directory))
        module = checkpoint.build(arch, config, state, dtype, quantized=False)
        lm = cls(module, config, tokenizer, dtype, progress, str(directory), quantized_layout, policy, mesh, mesh_axes)
        lm.release_freed_heap()  # what the build and the placement freed
        return lm

    # -- running ---------------------------------------------------------------------------------
    def cache_shapes(self, batch: Any, cache_len: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """Shapes of the caches (see :meth:`DecoderFunctions.cache_shapes`)."""
        return self.functions.cache_shapes(batch, cache_len)

    def new_cache(self, batch: int, cache_len: int) -> tuple[jax.Array, jax.Array]:
        """Zero key and value caches of :meth:`cache_shapes`."""
        return self.functions.new_cache(batch, cache_len)

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
            jax.numpy.reshape(tokens, (b, 1)), jax.numpy.reshape(positions, (b, 1)), k_cache, v_cache, np.zeros(b, np.int32), key,
            **sampling,
        )  # fmt: skip

    def compile_decode(self, batch: int, cache_len: int, do_sample: bool = False) -> bool:
        """Compiles :meth:`decode_step` for ``batch`` rows and caches of ``cache_len`` positions
        (sampling when ``do_sample``, else greedy) ahead of its first call, which then runs the
        compiled program. Returns False, doing nothing, where this method has compiled these
        arguments before (else True: a program ``jit`` already holds is found in its caches).

        The arguments are described as a decode step after :meth:`prefill` passes them (the
        tokens and caches on the state's device, as ``_step``'s outputs are; positions and
        indices from the host; on a mesh, the step's own shardings), so that the call finds this
        program in ``jit``'s cache.
        """
        key = (int(batch), int(cache_len), bool(do_sample))
        if key in self._decode_compiled:
            return False
        S = jax.ShapeDtypeStruct
        shard = self._batch_shardings()
        on = next(iter(jax.tree_util.tree_leaves(self.state))).sharding if shard is None else None
        k, v = jax.eval_shape(lambda: self.new_cache(batch, cache_len))
        prng = self._default_key if not do_sample else S((), jax.eval_shape(lambda: jax.random.key(0)).dtype)
        self._step.lower(
            self.state, S((batch, 1), np.int32, sharding=on), S((batch, 1), np.int32), S(k.shape, k.dtype, sharding=on),
            S(v.shape, v.dtype, sharding=on), S((batch,), np.int32), prng, np.float32(1.0), np.int32(0),
            np.float32(1.0), do_sample,
        ).compile()  # fmt: skip
        self._decode_compiled.add(key)
        return True

    def _run(self, tokens, positions, k_cache, v_cache, last, key, temperature=0.0, top_k=0, top_p=1.0):
        do_sample = temperature > 0
        if key is None:
            key = self._default_key
        if self.mesh is not None:  # host inputs become global arrays (every process passes the same)
            shard = self._batch_shardings()
            tokens, positions = _global(tokens, shard["rows"]), _global(positions, shard["rows"])
            last = _global(last, shard["batch"])
        return self._step(
            self.state, tokens, positions, k_cache, v_cache, last, key,
            np.float32(max(temperature, 1e-6)), np.int32(top_k), np.float32(top_p), do_sample,
        )  # fmt: skip

    def encode_prompt(self, prompt: str, chat: bool = False) -> list[int]:
        """Token ids of ``prompt`` (through the chat template when ``chat``; no BOS unless the
        model asks for one).

        Raises:
            ValueError: an empty prompt, or one that is not a string.
        """
        if not isinstance(prompt, str):
            raise ValueError(f"the prompt must be a string, got {type(prompt).__name__}")
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
            ValueError: no prompts, an empty prompt, ``max_new_tokens < 1``, a sampling parameter
                out of range (see :func:`~maxjax.models.sampling.check_sampling`), or a prompt
                that with the new tokens does not fit the model's context.
        """
        generation.check_request(len(prompts), max_new_tokens)
        check_sampling(temperature, top_k, top_p, seed)
        start = time.perf_counter()
        ids = [self.encode_prompt(p, chat) for p in prompts]
        return generation.run_generation(
            self, ids, list(prompts), max_new_tokens, start, temperature=temperature, top_k=top_k, top_p=top_p,
            seed=seed, stop_at_eos=stop_at_eos, on_token=on_token,
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
                a sampling parameter out of range, or a row that with the new tokens does not fit
                the model's context.
        """
        generation.check_request(len(token_ids), max_new_tokens)
        check_sampling(temperature, top_k, top_p, seed)
        start = time.perf_counter()
        ids = [[int(t) for t in row] for row in token_ids]
        vocab = self.config.vocab_size
        for r, row in enumerate(ids):
            if not row:
                raise ValueError(f"row {r}: the prompt is empty")
            bad = [t for t in row if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"row {r}: token id {bad[0]} is outside the vocabulary [0, {vocab})")
        return generation.run_generation(
            self, ids, [""] * len(ids), max_new_tokens, start, temperature=temperature, top_k=top_k, top_p=top_p,
            seed=seed, stop_at_eos=stop_at_eos, on_token=on_token,
        )  # fmt: skip

    def stream(self, prompt: str, max_new_tokens: int = 64, **kwargs: Any) -> Iterator[str]:
        """Yields the text of ``prompt``'s continuation piece by piece (see
        :func:`maxjax.models.generation.stream`); ``self.last_generation`` holds the result after."""
        return generation.stream(self, prompt, max_new_tokens, **kwargs)


def _global(x: Any, sharding: Any) -> Any:
    """A host array as a global ``jax.Array`` of ``sharding`` (each process gives its devices'
    blocks; in a multi-process run every process holds the same host array)."""
    if isinstance(x, jax.Array):
        return x if x.sharding.is_equivalent_to(sharding, x.ndim) else jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _prepare_mesh(module: Any, mesh: Any, axes: tuple[str, str]) -> tuple[Any, tuple[str, str]]:
    """Sets the module's tensor-parallel strategy and places its weights on ``mesh``."""
    if mesh is None:
        return None, tuple(axes)  # type: ignore[return-value]
    from maxjax.graph import ShardingStrategy
    from maxjax.graph.weight import auto_mesh

    mesh = auto_mesh(mesh)
    dp, tp = axes
    names = tuple(mesh.axis_names)
    unknown = [a for a in names if a not in (dp, tp)]
    if unknown:
        raise ValueError(f"mesh axes {unknown} are neither the data-parallel axis {dp!r} nor the tensor-parallel axis {tp!r}")
    n = int(mesh.shape[tp]) if tp in names else 1
    if n > 1:
        if not hasattr(type(module), "sharding_strategy"):
            raise ValueError(f"{type(module).__name__} has no tensor-parallel strategy: it cannot run over mesh axis {tp!r}")
        module.sharding_strategy = ShardingStrategy.tensor_parallel(n)
        module.to(mesh, axis=tp)
    else:
        module.to(mesh, axis=tp if tp in names else names[0])  # every weight replicated
    return mesh, (dp, tp)


def _progress_bar(total: int, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="weight", leave=False)
