"""``Trainer``: next-token training of a causal LM module, one compiled step (optax), on a mesh if given.

    model = maxjax.train.dequantized(load_model().module)          # or a module built and nn.init-ed
    apply_lora(model, ["q_proj", "v_proj"], rank=8, alpha=16, key=jax.random.key(0))
    trainer = Trainer(model, optax.adamw(1e-3), trainable="*lora_*")
    state = trainer.init(seed=0)
    for tokens in batches:                                        # int32 [batch, seq + 1]
        state, metrics = trainer.step(state, tokens)              # metrics["loss"]: mean next-token loss

How it runs. The module is traced once into a graph of ``module(tokens) -> logits [batch, seq,
vocab]`` (a Llama: every position's logits, its layers one scanned subgraph) and wrapped in a
:class:`maxjax.engine.Program`; its prepared state is split by name into the trainable weights
(differentiated, updated by the optimizer, donated each step so they update in place) and the
frozen ones (arguments of the step, never differentiated, never constants XLA could fold). The
weights of the scanned layers are stacked ``[n_layers, ...]``: the state's entries are named by
their layers' common pattern (``"layers.*.self_attn.q_proj.lora_A.weight"``). A trainable
pattern that selects only some layers of a stack trains those slices; the others are kept
bit-identical. Each batch shape compiles once (``num_compiles``, ``compile_seconds``): the whole
state (optimizer counts included) is placed on the step's devices at :meth:`init`, so step 2
reuses step 1's program.

With ``mesh`` (a ``jax.sharding.Mesh`` with axis ``data_axis``), the step is data parallel: each
batch is split over that axis (``NamedSharding(mesh, P(data_axis))``), weights and optimizer state
are replicated, and XLA adds the gradient all-reduce. ``remat=True`` recomputes each scanned
layer's activations in the backward pass (``jax.checkpoint``) instead of storing them.

Mixed precision (``compute_dtype="bfloat16"``): the standard recipe of Micikevicius et al.,
"Mixed Precision Training" (2018), as JAX users know it from jmp's ``Policy(param_dtype=float32,
compute_dtype=bfloat16, output_dtype=float32)`` and Flax's ``dtype=bfloat16, param_dtype=float32``.
The module is traced from a bfloat16 copy (:func:`maxjax.train.dequantized`), so activations and
the operands of every matmul are bfloat16 (XLA accumulates the dots in float32 on GPU and TPU and
rounds the result to bfloat16); the logits are float32 and the loss (softmax cross-entropy) is
computed in float32. The trainable weights (the master copy in :class:`TrainState`) and the
optimizer state stay float32: each step casts them to bfloat16 for the forward pass, and their
gradients come back through the cast as float32. Frozen weights are stored in bfloat16 (half the
memory); frozen GGUF-quantized weights are dequantized to bfloat16 once, at construction. No loss
scaling: bfloat16 has float32's exponent range, so gradients do not underflow.
Where the backend policy says ``bfloat16_autocast`` (CPUs without AMX-BF16), the step follows
``torch.autocast``'s recipe instead: the weights are the same bfloat16 copy, but the activations,
norms, attention and loss stay float32, and each stored-weight product rounds its float32
operand to bfloat16 and returns float32 sums (:attr:`Trainer.autocast`; the program's policy has
``autocast`` set); its recomputed layers keep those products' float32 results for the backward
pass (a SmolLM2 LoRA step on a 2-core Zen 5 EPYC: 1.19x the tokens/s of bfloat16 activations,
and a loss curve closer to float32's).
:meth:`Trainer.state_dict` then gives the trainable weights in float32 and the frozen ones in
bfloat16 (what the step ran with).

Frozen weights on a CPU with AMX-BF16: each frozen float matrix that the model multiplies as stored
(the base layers of a LoRA fine-tune; a tied embedding, also gathered, keeps its array too) is laid
out once, at construction, for maxjax's AMX kernel together with its transpose
(:class:`~maxjax.backend.kernels.amx.AmxWeight`), and its products, forward and ``x``'s cotangent,
run there. In float32 steps (the policy's ``frozen_precision``, ``HIGH``) that is four bfloat16
passes, relative error about 2^-16 (the trainable weights and their gradients stay exact float32;
pass a policy with ``frozen_precision=jax.lax.Precision.HIGHEST`` for XLA's exact products); the
exact values are not held twice: :meth:`Trainer.state_dict` reads them from the module, which the
Trainer never changes. In bfloat16 steps (``bfloat16_frozen_kernel``) it is one pass, XLA's
arithmetic, and the tiles give the weights back exactly. :attr:`Trainer.laid_out` names them.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Iterable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.backend.kernels import amx
from maxjax.driver import to_host_array
from maxjax.dtype import DType
from maxjax.engine import Program
from maxjax.graph import Graph, TensorType
from maxjax.graph.layer_weights import StackBits
from maxjax.graph.quantization import QuantizedArray
from maxjax.train.params import Patterns, select

#: what ``Trainer(compute_dtype=...)`` accepts
COMPUTE_DTYPES = ("float32", "bfloat16")

__all__ = ["TrainState", "Trainer", "next_token_loss"]


class TrainState(NamedTuple):
    """What changes during training (a pytree; checkpoint it with :mod:`maxjax.train.checkpoint`).

    Attributes:
        params: the trainable weights by state entry name (see :attr:`Trainer.entries`).
        opt_state: the optimizer's state.
        step: int32 scalar, steps taken.
        rng: a ``jax.random`` key, split once per step (for stochastic layers and users' own use).
    """

    params: dict[str, Any]
    opt_state: Any
    step: jax.Array
    rng: jax.Array


def next_token_loss(logits: jax.Array, tokens: jax.Array, mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Mean cross-entropy of predicting ``tokens[:, 1:]`` from ``logits [batch, seq, vocab]`` of
    ``tokens[:, :-1]`` (in nats per token), over positions where ``mask [batch, seq]`` is nonzero.

    Returns ``(loss, number of tokens counted)``, both float32 scalars.
    """
    import optax

    targets = tokens[:, 1:]
    ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
    weights = jnp.ones(ce.shape, jnp.float32) if mask is None else jnp.asarray(mask, jnp.float32)
    n = jnp.sum(weights)
    return jnp.sum(ce * weights) / jnp.maximum(n, 1.0), n


_LAYER_PREFIX = re.compile(r"^(.*?)(\d+)\.$")


def _low_precision_trainables(raw: Mapping[str, Any], trainable: Any) -> list[str]:
    """The trainable weights (all where ``trainable`` is None) of ``raw`` (fully-qualified name ->
    Weight) stored in bfloat16 or float16, such as those of a bfloat16 Hugging Face checkpoint
    loaded for float32 inference (``keep_16bit_weights``): a float32 Trainer trains a float32
    copy of the module then, so that their updates are not rounded to bfloat16. Empty where a
    selected weight is quantized (the Trainer then refuses it)."""
    names = list(raw)
    chosen = names if trainable is None else select(names, trainable)
    if any(raw[n].quantization_encoding is not None for n in chosen):
        return []  # a quantized weight selected: the Trainer refuses it, naming the fix (no silent dequantizing)
    return [n for n in chosen if raw[n].dtype.is_half()]


def _chain_template(prefixes: list[str], c: int) -> str:
    """``"layers.*."`` for prefixes ``layers.0. .. layers.N.``; ``"chain{c}[...]."`` otherwise."""
    parts = [_LAYER_PREFIX.match(p) for p in prefixes]
    if all(parts) and len({m.group(1) for m in parts}) == 1:
        return f"{parts[0].group(1)}*."
    return f"chain{c}[{prefixes[0]}..{prefixes[-1]}]."


class Trainer:
    """Next-token training of ``module`` with an optax optimizer (see the module docstring).

    Args:
        module: a causal LM module called as ``module(tokens [batch, seq]) -> logits [batch, seq,
            vocab]`` (``LlamaForCausalLM``), with its weights loaded.
        optimizer: an ``optax.GradientTransformation``.
        trainable: which weights train: name patterns (:mod:`maxjax.train.params`); None: all.
        remat: recompute each scanned layer in the backward pass (less memory, more compute);
            None (default): the backend policy's choice, off for float32 and its
            ``bfloat16_remat`` for bfloat16 (on for the CPU, where it is faster).
        scan: run chains of layers as one ``lax.scan`` (compile time flat in depth); False
            inlines every layer (compile time grows with depth).
        mesh: a ``jax.sharding.Mesh`` for data-parallel steps (None: one device).
        data_axis: the mesh axis the batch is split over.
        quantized_layout: the layout of frozen GGUF-quantized weights (None: the backend policy's).
        policy: a :class:`~maxjax.backend.BackendPolicy` (None: the default backend's).
        compute_dtype: ``"float32"`` (default) or ``"bfloat16"``: the dtype of activations and
            matmul operands (see the module docstring); master weights and optimizer state are
            float32 either way. ``"bfloat16"`` needs a policy with ``bfloat16_matmul``. A
            float32 Trainer of a model whose activations are float32 (its ``dtype`` attribute)
            and whose trainable weights include bfloat16 or float16 ones (a bfloat16 Hugging
            Face checkpoint loaded for inference keeps them where maxjax's kernel builds) trains a
            float32 copy of the module (:func:`~maxjax.train.trainable.dequantized`); frozen
            bfloat16 weights alone (LoRA) stay bfloat16, multiplied in float32. A bfloat16
            model (``dequantized(module, "bfloat16")``) trains bfloat16 weights as they are.

    Raises:
        ValueError: a trainable pattern that matches no weight; a quantized weight selected as
            trainable; a mesh without ``data_axis``; an unknown ``compute_dtype``;
            ``"bfloat16"`` on a platform whose policy has no native bfloat16 matmul (a CPU
            without ``avx512_bf16``/``amx_bf16``).

    Attributes:
        frozen: the frozen weights by state entry name, as the step takes them (placed on its
            devices): arrays, or, for bfloat16 stacks where the policy says
            (``bfloat16_stack_bits``), :class:`~maxjax.graph.layer_weights.StackBits` holding their
            bit patterns (:meth:`state_dict` gives them back as bfloat16), or, on a CPU with
            AMX-BF16 (the policy's ``frozen_precision`` / ``bfloat16_frozen_kernel``),
            :class:`~maxjax.backend.kernels.amx.AmxWeight` (laid out for the AMX kernel with
            their transposes).
        laid_out: the names of the :attr:`frozen` entries held as ``AmxWeight``.
    """

    def __init__(
        self,
        module: Any,
        optimizer: Any,
        *,
        trainable: Patterns | None = None,
        remat: bool | None = None,
        scan: bool = True,
        mesh: jax.sharding.Mesh | None = None,
        data_axis: str = "dp",
        quantized_layout: str | None = None,
        policy: Any = None,
        compute_dtype: str = "float32",
    ):
        from maxjax.backend.policy import BFLOAT16_CPU_FLAGS, policy_for

        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be one of {COMPUTE_DTYPES}, got {compute_dtype!r}")
        resolved = policy_for(policy)
        if compute_dtype == "bfloat16" and not resolved.bfloat16_matmul:
            flags = " or ".join(sorted(BFLOAT16_CPU_FLAGS, reverse=True))
            lack = f" (no {flags} in its CPU flags)" if resolved.platform == "cpu" else ""
            raise ValueError(
                f"compute_dtype='bfloat16': this {resolved.platform} has no native bfloat16 matmul{lack}, "
                "so XLA would emulate it, slower than float32; use "
                f"compute_dtype='float32', or pass policy=dataclasses.replace(maxjax.backend.policy_for('{resolved.platform}'), "
                "bfloat16_matmul=True) to accept the emulation"
            )
        self.compute_dtype = compute_dtype
        if remat is None:
            remat = compute_dtype == "bfloat16" and resolved.bfloat16_remat
        self.module = module
        self.optimizer = optimizer
        self.mesh = mesh
        self.data_axis = data_axis
        if mesh is not None and data_axis not in mesh.axis_names:
            raise ValueError(f"the mesh has axes {tuple(mesh.axis_names)}, not the data axis {data_axis!r}")
        raw = module.raw_state_dict()  # every weight by its fully-qualified name before tracing
        if compute_dtype == "float32" and getattr(module, "dtype", None) == DType.float32 and _low_precision_trainables(raw, trainable):
            from maxjax.train.trainable import dequantized

            module = dequantized(module, DType.float32)  # float32 masters and products, as float32 training means
        master = None
        #: bfloat16 steps in the policy's autocast recipe (``bfloat16_autocast``): float32 activations,
        #: bfloat16 operands of the stored-weight products
        self.autocast = compute_dtype == "bfloat16" and resolved.bfloat16_autocast
        if compute_dtype == "bfloat16":  # trace a bfloat16 copy; keep the float32 values as masters
            from maxjax.train.trainable import dequantized

            master = module.state_dict(auto_initialize=False)
            module = dequantized(module, DType.bfloat16, DType.float32 if self.autocast else None)
        if self.autocast:
            policy = dataclasses.replace(resolved, autocast=True)
        if mesh is not None and resolved.attention_kernel:  # a split batch: the kernel's custom call does not partition
            policy = dataclasses.replace(policy_for(policy), attention_kernel=False)
        self.graph = Graph("train_step", forward=module, input_types=[TensorType(DType.int32, ["batch", "seq"])])
        self.program = Program(
            self.graph, scan=scan, remat=remat, quantized_layout=quantized_layout, policy=policy, layer_weights="stacked"
        )  # stacked: a per-layer weight's gradient would be one array per layer and switch branch
        prepared = self.program.prepare(module.state_dict(auto_initialize=False))
        #: state entry name -> the registry names it holds (one, or one per layer of a stack)
        self.entries: dict[str, list[str]] = {}
        self._where: dict[str, tuple[Any, ...]] = {}
        values: dict[str, Any] = {}
        for k, v in prepared["weights"].items():
            self.entries[k], self._where[k], values[k] = [k], ("weights", k), v
        for c, (chain, stacked) in enumerate(zip(self.program.chains, prepared["stacked"])):
            template = _chain_template(chain.prefixes, c)
            for k, v in stacked.items():
                name = template + k
                self.entries[name], self._where[name], values[name] = [p + k for p in chain.prefixes], ("stacked", c, k), v
        names = [n for ns in self.entries.values() for n in ns]
        chosen = set(names if trainable is None else select(names, trainable))
        self._masks: dict[str, np.ndarray] = {}
        train_entries = []
        for entry, ns in self.entries.items():
            hit = [n in chosen for n in ns]
            if not any(hit):
                continue
            v = values[entry]
            if isinstance(v, QuantizedArray) or not jnp.issubdtype(v.dtype, jnp.floating):
                what = f"{v.encoding.value}-quantized" if isinstance(v, QuantizedArray) else str(v.dtype)
                first = ns[hit.index(True)]
                raise ValueError(
                    f"trainable weight {first!r} is {what}: it cannot be trained; make a float copy with "
                    "maxjax.train.dequantized(module), or leave it out of trainable="
                )
            train_entries.append(entry)
            if not all(hit):
                self._masks[entry] = np.asarray(hit)
        self.trainable_entries = train_entries
        self.trainable_names = [n for n in names if n in chosen]
        self._initial = {e: values[e] for e in train_entries}
        if master is not None:  # float32 masters from the module's own values (not rounded to bfloat16)
            for e in train_entries:
                v = self._initial[e]
                for n in self.entries[e]:
                    raw = master[n]
                    if isinstance(raw, QuantizedArray) or not jnp.issubdtype(np.asarray(raw).dtype, jnp.floating):
                        raise ValueError(
                            f"trainable weight {n!r} is quantized: it cannot be trained; make a float copy with "
                            "maxjax.train.dequantized(module), or leave it out of trainable="
                        )
                ws = [jnp.asarray(master[n], jnp.float32) for n in self.entries[e]]
                m = jnp.stack(ws) if self._where[e][0] == "stacked" else ws[0]
                if m.shape != v.shape:  # a weight kept in another device layout: its bfloat16 value, widened
                    m = v.astype(jnp.float32)
                self._initial[e] = m
        self.frozen = self._place({e: v for e, v in values.items() if e not in self._initial})
        self.laid_out: list[str] = []
        for e in list(self.frozen):  # frozen weights laid out for the AMX kernel (frozen_precision, bfloat16_frozen_kernel)
            how = self._lays_out(e, self.frozen[e])
            if how is not None:
                where = self._where[e]
                values.pop(e, None)
                (prepared["weights"] if where[0] == "weights" else prepared["stacked"][where[1]]).pop(where[-1], None)
                self.frozen[e] = amx.lay_out(self.frozen.pop(e), self._replicated(), transposed=True, keep=how == "kept")
                self.laid_out.append(e)
        for e in list(self.frozen):  # frozen bfloat16 stacks kept as their bits (see logits)
            v = self.frozen[e]
            if self._scanned_as_bits(e, v):
                where = self._where[e]
                values.pop(e, None)  # the last other reference: one stack is held twice at a time
                prepared["stacked"][where[1]].pop(where[2], None)
                self.frozen[e] = StackBits.of(v)  # one copy now, and none at each step
            del v
        self.num_compiles = 0
        #: seconds each compiled batch shape took to compile, by ``(batch, seq + 1)``
        self.compile_seconds: dict[tuple[int, ...], float] = {}
        self._compiled: dict[Any, Any] = {}
        self._step_jit = jax.jit(self._step_fn, donate_argnums=(0,))
        self._loss_jit = jax.jit(self._loss_fn)

    # -- placement -------------------------------------------------------------------------------
    def _replicated(self) -> Any:
        if self.mesh is None:
            return jax.devices()[0]
        return jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())

    def _batch_sharding(self) -> Any:
        if self.mesh is None:
            return jax.devices()[0]
        return jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(self.data_axis))

    def _place(self, tree: Any) -> Any:
        return jax.device_put(tree, self._replicated())

    def _batch(self, tokens: Any, mask: Any) -> tuple[jax.Array, jax.Array | None]:
        tokens = np.asarray(tokens) if not isinstance(tokens, jax.Array) else tokens
        if tokens.ndim != 2 or tokens.shape[1] < 2:
            raise ValueError(f"tokens must be int [batch, seq + 1] with seq >= 1, got shape {tuple(tokens.shape)}")
        if not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(f"tokens must be integer token ids, got {tokens.dtype}")
        if self.mesh is not None:
            n = self.mesh.shape[self.data_axis]
            if tokens.shape[0] % n:
                raise ValueError(f"batch {tokens.shape[0]} does not split over the {n} devices of mesh axis {self.data_axis!r}")
        sharding = self._batch_sharding()
        tokens = jax.device_put(jnp.asarray(tokens, jnp.int32), sharding)
        if mask is not None:
            mask = np.asarray(mask, np.float32)
            if mask.shape != (tokens.shape[0], tokens.shape[1] - 1):
                raise ValueError(f"mask must be [batch, seq] = {(tokens.shape[0], tokens.shape[1] - 1)}, got {mask.shape}")
            mask = jax.device_put(jnp.asarray(mask), sharding)
        return tokens, mask

    # -- state -------------------------------------------------------------------------------------
    def init(self, seed: int | jax.Array = 0) -> TrainState:
        """The initial :class:`TrainState`: copies of the module's trainable weights, the optimizer's
        initial state, step 0 and a key from ``seed`` (an int or a ``jax.random`` key), all placed
        on the step's devices."""
        params = self._place(jax.tree.map(jnp.copy, self._initial))
        key = jax.random.key(seed) if isinstance(seed, int) else seed
        state = TrainState(params, self.optimizer.init(params), jnp.zeros((), jnp.int32), key)
        return self._place(state)

    def state_dict(self, state: TrainState) -> dict[str, Any]:
        """Every weight by registry name (trainable from ``state``, frozen as prepared; the layers
        of a stack unstacked), e.g. for :func:`~maxjax.train.lora.merge_lora` and export."""
        frozen = {e: v.value() if isinstance(v, StackBits) else v for e, v in self.frozen.items() if e not in self.laid_out}
        out = self.program.unstack(self._program_state(state.params, frozen))
        only = [e for e in self.laid_out if self.frozen[e].array is None and not self.frozen[e].bfloat16]
        for e in self.laid_out:
            if e in only:
                continue
            full = self.frozen[e].weight()  # the kept array, or the bfloat16 weight from its tiles (exact)
            for i, n in enumerate(self.entries[e]):
                out[n] = full[i] if self._where[e][0] == "stacked" else full
        if only:  # float32: their exact values, from the module (not held twice)
            held = self.module.state_dict(auto_initialize=False)
            for e in only:
                for n in self.entries[e]:
                    out[n] = jnp.asarray(to_host_array(held[n]))
        return out

    def trained_weights(self, state: TrainState) -> dict[str, jax.Array]:
        """The trainable weights only, by registry name (``module.load_state_dict(...,
        strict=False)`` takes them)."""
        full = self.program.unstack(self._program_state(state.params, {}))
        return {n: full[n] for n in self.trainable_names}

    def _scanned_as_bits(self, entry: str, v: Any) -> bool:
        """Whether the frozen value ``v`` of ``entry`` goes through the layer scan as its bits: a
        bfloat16 stack, where the policy says (``bfloat16_stack_bits``)."""
        return (
            self.program.policy.bfloat16_stack_bits
            and self._where[entry][0] == "stacked"
            and isinstance(v, jax.Array)
            and v.dtype == jnp.bfloat16
        )

    def _lays_out(self, entry: str, v: Any) -> str | None:
        """Whether and how the frozen value ``v`` of ``entry`` is laid out for the AMX kernel: in a
        step on one CPU device, a float32 matrix (or stack) where the policy's
        ``frozen_precision`` is ``HIGH``, or a bfloat16 one where its ``bfloat16_frozen_kernel``
        says, that the kernel takes: ``"only"`` where the model only multiplies it as stored (and,
        for float32, the module holds a float32 value of its shape under each of its names: what
        :meth:`state_dict` reads back), ``"kept"`` (its array kept beside the tiles) for a matrix
        the model also uses otherwise (a tied embedding); else None."""
        from jax import lax

        policy = self.program.policy
        if policy.platform != "cpu" or self.mesh is not None or not isinstance(v, jax.Array):
            return None
        if self.compute_dtype == "bfloat16":
            if not policy.bfloat16_frozen_kernel or v.dtype != jnp.bfloat16:
                return None
        elif policy.frozen_precision != lax.Precision.HIGH or v.dtype != jnp.float32:
            return None
        where = self._where[entry]
        if where[0] == "weights":
            uses, ndim = self.graph._weight_uses.get(where[1]), 2
        else:
            uses, ndim = self.program.chains[where[1]].sub._weight_uses.get(where[2]), 3
        if not uses or "stored_rhs" not in uses or v.ndim != ndim or not amx.lays_out(v.shape[-2:], v.dtype):
            return None
        if uses != {"stored_rhs"}:
            return "kept" if ndim == 2 else None
        if v.dtype == jnp.bfloat16:
            return "only"  # its tiles give it back exactly
        held = self.module.raw_state_dict()
        for n in self.entries[entry]:
            w = held.get(n)
            if w is None or w.value is None or (w.stored_device_layout is not None and not w.stored_device_layout.is_identity):
                return None
            value = to_host_array(w.value)  # no copy of a host or CPU array
            if value.shape != tuple(v.shape[-2:]) or value.dtype != np.float32:
                return None
        return "only"

    def _program_state(self, params: Mapping[str, Any], frozen: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"weights": {}, "stacked": [{} for _ in self.program.chains]}
        for entry, v in (*params.items(), *frozen.items()):
            where = self._where[entry]
            if where[0] == "weights":
                out["weights"][where[1]] = v
            else:
                out["stacked"][where[1]][where[2]] = v
        return out

    # -- the step ----------------------------------------------------------------------------------
    def logits(self, params: Mapping[str, Any], frozen: Mapping[str, Any], tokens: jax.Array) -> jax.Array:
        """``logits [batch, seq, vocab]`` float32 of ``tokens [batch, seq]`` (pure: jit/grad it).

        With ``compute_dtype="bfloat16"`` the float32 ``params`` are cast to bfloat16 here, so
        their gradients come back float32; frozen bfloat16 stacks are handed to the layer scan as
        their bits where the policy says (``bfloat16_stack_bits``: never differentiated, so
        nothing is lost). :attr:`frozen` holds them so already (:class:`StackBits`, converted once
        at construction: a bitcast inside the step is a copy of every stack at every step, 270 ms
        of a 2.4 s SmolLM2 LoRA step on a 2-core AVX-512 Xeon); a bfloat16 stack passed here is
        converted in the step."""
        if self.compute_dtype == "bfloat16":
            params = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
        state = self._program_state(params, frozen)
        for entry, v in frozen.items():  # frozen bfloat16 stacks sliced as their bits
            if self._scanned_as_bits(entry, v):
                where = self._where[entry]
                state["stacked"][where[1]][where[2]] = StackBits.of(v)
        return self.program.apply(state, tokens)[0]

    def _loss_fn(self, params: Any, frozen: Any, tokens: jax.Array, mask: Any) -> tuple[jax.Array, jax.Array]:
        return next_token_loss(self.logits(params, frozen, tokens[:, :-1]), tokens, mask)

    def _step_fn(self, state: TrainState, frozen: Any, tokens: jax.Array, mask: Any) -> tuple[TrainState, dict[str, Any]]:
        import optax

        self.num_compiles += 1  # runs once per trace
        (loss, n), grads = jax.value_and_grad(self._loss_fn, has_aux=True)(state.params, frozen, tokens, mask)
        with jax.numpy_dtype_promotion("standard"):  # optax mixes int counts and float rates
            updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
        for entry, m in self._masks.items():  # layers of a stack left out of trainable= stay as they were
            keep = jnp.asarray(m).reshape((-1,) + (1,) * (params[entry].ndim - 1))
            params[entry] = jnp.where(keep, params[entry], state.params[entry])
        rng, _ = jax.random.split(state.rng)
        return TrainState(params, opt_state, state.step + 1, rng), {"loss": loss, "tokens": n}

    def _compiled_step(self, state: TrainState, tokens: jax.Array, mask: Any) -> Any:
        key = (tuple(tokens.shape), mask is None)
        compiled = self._compiled.get(key)
        if compiled is None:
            start = time.perf_counter()
            compiled = self._step_jit.lower(state, self.frozen, tokens, mask).compile()
            self.compile_seconds[tuple(tokens.shape)] = time.perf_counter() - start
            self._compiled[key] = compiled
        return compiled

    def compile(self, state: TrainState, tokens: Any, mask: Any = None) -> float:
        """Compiles the step for ``tokens``'s shape (once); returns the seconds it took."""
        tokens, mask = self._batch(tokens, mask)
        self._compiled_step(state, tokens, mask)
        return self.compile_seconds[tuple(tokens.shape)]

    def step(self, state: TrainState, tokens: Any, mask: Any = None) -> tuple[TrainState, dict[str, jax.Array]]:
        """One optimizer step on ``tokens`` int ``[batch, seq + 1]`` (inputs ``[:, :-1]``, targets
        ``[:, 1:]``), counting positions where ``mask [batch, seq]`` is nonzero (default: all).

        ``state`` is donated (its arrays are reused for the new state): keep only the returned one.
        Returns ``(new state, {"loss": mean next-token loss before the update, "tokens": count})``.

        Raises:
            ValueError: tokens not int ``[batch, seq + 1]``; a batch the mesh cannot split; a
                mask of another shape.
        """
        tokens, mask = self._batch(tokens, mask)
        return self._compiled_step(state, tokens, mask)(state, self.frozen, tokens, mask)

    def loss(self, state: TrainState, tokens: Any, mask: Any = None) -> tuple[jax.Array, jax.Array]:
        """``(mean next-token loss, tokens counted)`` of ``tokens [batch, seq + 1]`` (no update)."""
        tokens, mask = self._batch(tokens, mask)
        return self._loss_jit(state.params, self.frozen, tokens, mask)

    def perplexity(self, state: TrainState, batches: Iterable[Any]) -> float:
        """``exp`` of the mean next-token loss over every token of ``batches`` (each int ``[batch,
        seq + 1]``).

        Raises:
            ValueError: no batches.
        """
        total, count = 0.0, 0.0
        for tokens in batches:
            loss, n = self.loss(state, tokens)
            total += float(loss) * float(n)
            count += float(n)
        if not count:
            raise ValueError("perplexity: no tokens")
        return float(np.exp(total / count))

