"""MAX 26.7 reference for ``max.nn.moe`` (``MoEGate``, ``MoE``), ``VocabParallelEmbedding``, the
``Embedding`` weight name and ``DeepseekYarnRotaryEmbedding`` (see scripts/reference_max.py).

What MAX 26.7 runs on this CPU, and so what is here:

- ``MoEGate`` (a ``Linear`` then ``ops.top_k``): its outputs on ``x`` for a float32 gate
  (``gate.idx``, ``gate.scores``).
- ``MoE``: its weight names, shapes and dtypes (``moe.keys``, ``moe.shapes``, ``moe.dtypes``; the gate is
  bfloat16 whatever ``dtype`` is) but no numbers: ``MoE.__call__`` builds ``mo.moe.create.indices``,
  ``grouped_matmul_ragged``, ``fused_silu`` and ``mo.moe.finalize``, whose kernels have no CPU
  implementation (MAX's own docstrings: "the kernel has no CPU implementation"); a CPU graph of a
  float32 ``MoE`` fails at ``InferenceSession.load`` ("Failed to compile the model"). maxjax's
  tests compare ``MoE`` with NumPy written from MAX's source instead.
- ``VocabParallelEmbedding``: nothing runs; its constructor builds an ``Allreduce`` that asks for a
  GPU ("failed to create device: No supported "gpu" device available"), even for CPU devices.
- ``Embedding(..., name=...)``: its state_dict key (``embedding.keys``).
- ``DeepseekYarnRotaryEmbedding``: ``freqs_cis`` and rotated activations, ``compute_scale()``.
- ``sig.<name>``: ``str(inspect.signature(...))`` of the public callables.
"""

from __future__ import annotations

import numpy as np

HID, E, K = 8, 6, 2


def build() -> dict[str, np.ndarray]:
    import inspect

    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType
    from max.nn import Embedding, Module
    from max.nn import moe as mm
    from max.nn.activation import GatedActivation
    from max.nn.rotary_embedding import DeepseekYarnRopeScalingParams, DeepseekYarnRotaryEmbedding
    from max.nn.embedding import VocabParallelEmbedding
    from max.nn.data_parallelism import split_batch, split_batch_replicated

    cpu = DeviceRef.CPU()
    rng = np.random.default_rng(26)
    out: dict[str, np.ndarray] = {}
    public = {
        "MoE": mm.MoE, "MoEGate": mm.MoEGate, "forward_moe_sharded_layers": mm.forward_moe_sharded_layers,
        "GatedActivation": GatedActivation, "VocabParallelEmbedding": VocabParallelEmbedding,
        "make_concatenated_gated_activation_fn": mm.make_concatenated_gated_activation_fn,
        "make_interleaved_gated_activation_fn": mm.make_interleaved_gated_activation_fn,
        "DeepseekYarnRotaryEmbedding": DeepseekYarnRotaryEmbedding,
        "DeepseekYarnRopeScalingParams": DeepseekYarnRopeScalingParams,
        "split_batch": split_batch, "split_batch_replicated": split_batch_replicated,
    }  # fmt: skip
    for name, obj in public.items():
        out[f"sig.{name}"] = np.array(str(inspect.signature(obj)))

    moe = mm.MoE([cpu], HID, E, K, 5, has_shared_experts=True, shared_experts_dim=4, dtype=DType.float32)
    sd = moe.raw_state_dict()
    keys = sorted(sd)
    out["moe.keys"] = np.array(keys)
    out["moe.shapes"] = np.array([str([int(d) for d in sd[k].shape]) for k in keys])
    out["moe.dtypes"] = np.array([str(sd[k].dtype) for k in keys])
    out["embedding.keys"] = np.array(sorted(Embedding(10, 4, DType.float32, cpu, name="emb").raw_state_dict()))

    rope = DeepseekYarnRotaryEmbedding(
        16, 4, 10000.0, 32, head_dim=16, interleaved=True,
        scaling_params=DeepseekYarnRopeScalingParams(
            scaling_factor=40.0, original_max_position_embeddings=8, beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=0.707,
        ),
    )  # fmt: skip
    out["deepseek_yarn.scale"] = np.asarray(rope.compute_scale())

    class Root(Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = mm.MoEGate([cpu], HID, E, K, DType.float32)

        def __call__(self, x, xr):
            idx, scores = self.gate(x)
            return idx, scores, rope.freqs_cis, rope(xr), rope(xr, start_pos=3)

    root = Root()
    weights = {k: rng.standard_normal(tuple(int(d) for d in w.shape)).astype(np.float32) for k, w in root.raw_state_dict().items()}
    root.load_state_dict(weights)
    x = rng.standard_normal((7, HID)).astype(np.float32)
    xr = rng.standard_normal((2, 5, 4, 16)).astype(np.float32)
    g = Graph(
        "moe_ref", forward=root,
        input_types=[TensorType(DType.float32, list(x.shape), cpu), TensorType(DType.float32, list(xr.shape), cpu)],
    )  # fmt: skip
    res = [r.to_numpy() for r in InferenceSession().load(g, weights_registry=root.state_dict()).execute(x, xr)]
    out["x"], out["xr"] = x, xr
    out.update({f"w.{k}": v for k, v in weights.items()})
    out["gate.idx"], out["gate.scores"] = res[0], res[1]
    out["deepseek_yarn.freqs_cis"], out["deepseek_yarn.out"], out["deepseek_yarn.out_start3"] = res[2:5]
    return out
