"""MAX 26.7 reference for ``TensorParallelAttentionWithRope``, ``DistributedTransformerBlock`` and
``DistributedTransformer`` (see scripts/reference_max.py).

What MAX 26.7 does on this CPU-only machine, and so what is here:

- ``TensorParallelAttentionWithRope`` refuses CPU devices in its constructor
  (``tp_attn.cpu_error``: "TensorParallelAttentionWithRope does not support CPU devices"), and on
  GPU ``DeviceRef`` s its ``Allreduce`` opens the accelerators (``Accelerator(id)``), which fails
  with no GPU. So no MAX numbers: the layers are built on ``DeviceRef.GPU(0), GPU(1)`` with
  ``max.nn.comm.allreduce.Accelerator`` replaced by a stub while they are constructed (nothing is
  compiled or run), which gives MAX's weight names, shapes and per-device shard shapes:
  ``tp_attn.keys``/``.shapes`` (the layer's ``raw_state_dict``), ``tp_attn.shard{i}.shapes``
  (``list_of_attentions[i]``'s weights, in the order of ``tp_attn.keys``), and the same of the
  single-device ``AttentionWithRope`` (``attn.keys``/``.shapes``); ``dist.keys``/``.shapes`` of
  a 2-layer ``DistributedTransformer`` and ``single.keys``/``.shapes`` of the single-device
  ``Transformer`` built from the same sizes (the same checkpoint loads into both).
- ``sig.<name>``: ``str(inspect.signature(...))`` of the three classes.

Sizes: hidden 32, 4 heads, 2 KV heads (head_dim 8), 2 layers, vocab 64, MLP 64.
"""

from __future__ import annotations

import numpy as np

H, NH, NKV, D, L, V, FF = 32, 4, 2, 8, 2, 64, 64


def _keys_shapes(sd: dict) -> tuple[np.ndarray, np.ndarray]:
    keys = sorted(sd)
    return np.array(keys), np.array([str([int(d) for d in sd[k].shape]) for k in keys])


def build() -> dict[str, np.ndarray]:
    import inspect

    import max.nn.comm.allreduce as allreduce_mod
    from max.dtype import DType
    from max.graph import DeviceRef, Graph
    from max.nn import (
        MLP, ColumnParallelLinear, Embedding, Linear, RMSNorm, RotaryEmbedding, Transformer, TransformerBlock,
        VocabParallelEmbedding,
    )  # fmt: skip
    from max.nn.attention import AttentionWithRope, TensorParallelAttentionWithRope
    from max.nn.kv_cache import MHAKVCacheParams
    from max.nn.transformer import DistributedTransformer, DistributedTransformerBlock

    out: dict[str, np.ndarray] = {}
    for name, obj in {
        "TensorParallelAttentionWithRope": TensorParallelAttentionWithRope,
        "DistributedTransformerBlock": DistributedTransformerBlock,
        "DistributedTransformer": DistributedTransformer,
    }.items():
        out[f"sig.{name}"] = np.array(str(inspect.signature(obj)))

    f32 = DType.float32
    rope = RotaryEmbedding(H, NH, 10000.0, 64, head_dim=D)
    cpu = [DeviceRef.CPU()]
    gpus = [DeviceRef.GPU(0), DeviceRef.GPU(1)]

    def kv(devices):
        return MHAKVCacheParams(dtype=f32, head_dim=D, num_layers=L, devices=devices, page_size=4, n_kv_heads=NKV)

    attn_kw = dict(rope=rope, num_attention_heads=NH, num_key_value_heads=NKV, hidden_size=H)
    try:
        TensorParallelAttentionWithRope(**attn_kw, kv_params=kv(cpu), devices=cpu)
    except ValueError as e:
        out["tp_attn.cpu_error"] = np.array(str(e))

    def norm():
        return RMSNorm(H, f32, 1e-5, multiply_before_cast=False)

    real_accelerator = allreduce_mod.Accelerator
    allreduce_mod.Accelerator = lambda id: f"accelerator {id}"  # construction only: no GPU here
    try:
        tp = TensorParallelAttentionWithRope(**attn_kw, kv_params=kv(gpus), devices=gpus)
        layers = [
            DistributedTransformerBlock(
                attention=TensorParallelAttentionWithRope(**attn_kw, kv_params=kv(gpus), devices=gpus),
                mlp=MLP(f32, None, H, FF, gpus), attention_norm=norm(), mlp_norm=norm(), devices=gpus,
            )
            for _ in range(L)
        ]  # fmt: skip
        dist = DistributedTransformer(
            H, NH, layers, norm(), ColumnParallelLinear(H, V, f32, gpus), VocabParallelEmbedding(V, H, f32, gpus),
            kv(gpus), gpus, rope,
        )  # fmt: skip
    finally:
        allreduce_mod.Accelerator = real_accelerator
    out["tp_attn.keys"], out["tp_attn.shapes"] = _keys_shapes(tp.raw_state_dict())
    for i, shard in enumerate(tp.list_of_attentions):
        sd = shard.raw_state_dict()
        keys = sorted(sd)
        shapes = []
        for j, k in enumerate(keys):
            with Graph(f"shard{i}_{j}", input_types=[]):  # a shard's shape is a slice of its host: MAX needs a graph
                shapes.append(str([int(d) for d in sd[k].shape]))
        out[f"tp_attn.shard{i}.keys"], out[f"tp_attn.shard{i}.shapes"] = np.array(keys), np.array(shapes)
        out[f"tp_attn.shard{i}.heads"] = np.array([shard.n_heads, shard.num_key_value_heads])
    out["dist.keys"], out["dist.shapes"] = _keys_shapes(dist.raw_state_dict())

    attn = AttentionWithRope(**attn_kw, kv_params=kv(cpu))
    out["attn.keys"], out["attn.shapes"] = _keys_shapes(attn.raw_state_dict())
    single_layers = [
        TransformerBlock(
            attention=AttentionWithRope(**attn_kw, kv_params=kv(cpu)), mlp=MLP(f32, None, H, FF, cpu),
            attention_norm=norm(), mlp_norm=norm(),
        )
        for _ in range(L)
    ]  # fmt: skip
    single = Transformer(
        H, NH, single_layers, norm(), Linear(H, V, f32, cpu[0]), Embedding(V, H, f32, cpu[0]), kv(cpu), rope
    )
    out["single.keys"], out["single.shapes"] = _keys_shapes(single.raw_state_dict())
    return out
