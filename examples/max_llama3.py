"""SmolLM2 built the way MAX's ``llama3.py`` builds a Llama3, run as a MAX graph through
``InferenceSession`` on a ragged batch over a paged KV cache; imports say ``maxjax``, not ``max``.

The model is a ``Transformer`` of ``TransformerBlock(attention=AttentionWithRope(...),
mlp=MLP(...), attention_norm=RMSNorm(...), mlp_norm=RMSNorm(...))`` with ``KVCacheParams``
(``MHAKVCacheParams``) and ``ReturnLogits.LAST_TOKEN``; its weights come from the bundled GGUF by
MAX's names in llama.cpp's row order, with the interleaved rotary embedding (what MAX's llama3
does for GGUF files). The graph's inputs are MAX's: ``tokens int64 [total_seq_len]``,
``input_row_offsets uint32 [batch + 1]``, ``return_n_logits int64 [1]`` and the paged cache's
inputs. Both reference prompts run as one ragged batch (two sequences of different lengths:
prefill, then one decode row each per step), greedy, and the tokens are compared with
``maxjax generate``'s.

Run: ``python examples/max_llama3.py [--max-new-tokens N]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import DeviceRef, Graph, TensorType
from maxjax.graph.weights import GGUFWeights
from maxjax.nn import (
    MLP, AttentionWithRope, Embedding, Linear, ReturnLogits, RMSNorm, RotaryEmbedding, Transformer, TransformerBlock,
)
from maxjax.nn.kv_cache import MHAKVCacheParams, PagedKVCache

REFERENCE = Path(__file__).resolve().parent.parent / "tests" / "data" / "smollm2_reference.json"


def build_llama3(config, kv_params: MHAKVCacheParams, device: DeviceRef) -> Transformer:
    """MAX's ``Llama3(Transformer)`` construction for a float32 RMSNorm llama (llama3.py)."""
    rope = RotaryEmbedding(
        config.hidden_size, config.num_attention_heads, config.rope_theta, config.max_position_embeddings,
        head_dim=config.head_dim, interleaved=True,
    )  # fmt: skip

    def norm() -> RMSNorm:
        return RMSNorm(config.hidden_size, DType.float32, config.rms_norm_eps, multiply_before_cast=False)

    layers = [
        TransformerBlock(
            attention=AttentionWithRope(
                rope=rope,
                num_attention_heads=config.num_attention_heads,
                num_key_value_heads=config.num_key_value_heads,
                hidden_size=config.hidden_size,
                kv_params=kv_params,
                dtype=DType.float32,
                devices=[device],
            ),
            mlp=MLP(DType.float32, None, config.hidden_size, config.intermediate_size, [device]),
            attention_norm=norm(),
            mlp_norm=norm(),
        )
        for _ in range(config.num_hidden_layers)
    ]
    embedding = Embedding(config.vocab_size, config.hidden_size, DType.float32, device)
    output = Linear(config.hidden_size, config.vocab_size, DType.float32, device)
    if config.tie_word_embeddings:
        output.set_shared_weight("weight", embedding.weight)
    return Transformer(
        dim=config.hidden_size,
        n_heads=config.num_attention_heads,
        layers=layers,
        norm=norm(),
        output=output,
        embedding=embedding,
        kv_params=kv_params,
        rope=rope,
        return_logits=ReturnLogits.LAST_TOKEN,
    )


def load(gguf: Path, page_size: int = 16, dequantize: bool = False) -> tuple[Transformer, MHAKVCacheParams, object]:
    """The model with the GGUF's weights by MAX's names (quantized weights stay packed, or become
    float32 with ``dequantize``), its KV cache params, and the config."""
    from maxjax.graph.weights.adapters import adapt
    from maxjax.models.llama.config import LlamaConfig
    from maxjax.models.llama.weights import LLAMA_GGUF_NAMES

    weights = GGUFWeights(gguf)
    config = LlamaConfig.from_gguf(weights, str(gguf))
    device = DeviceRef.CPU()
    kv_params = MHAKVCacheParams(
        DType.float32, config.head_dim, config.num_hidden_layers, [device], page_size=page_size,
        n_kv_heads=config.num_key_value_heads,
    )  # fmt: skip
    model = build_llama3(config, kv_params, device)
    state = adapt(weights, LLAMA_GGUF_NAMES)
    if dequantize:
        state = {k: w.dequantize() for k, w in state.items()}
    model.load_state_dict(state, override_quantization_encoding=not dequantize)
    return model, kv_params, config


def graph_of(model: Transformer, kv_params: MHAKVCacheParams) -> Graph:
    """MAX's llama3 graph: tokens, row offsets, return_n_logits, then the KV cache inputs."""
    device = DeviceRef.CPU()
    input_types = [
        TensorType(DType.int64, ["total_seq_len"], device),
        TensorType(DType.uint32, ["input_row_offsets_len"], device),
        TensorType(DType.int64, [1], DeviceRef.CPU()),
        *kv_params.flattened_kv_inputs(),
    ]

    def forward(tokens, input_row_offsets, return_n_logits, *kv_inputs):
        (kv_collection,) = kv_params.unflatten_kv_inputs(iter(kv_inputs))
        return model(tokens.tensor, kv_collection, return_n_logits.tensor, input_row_offsets.tensor)

    return Graph("llama3", forward, input_types=input_types)


def greedy_ragged(compiled, cache: PagedKVCache, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy decoding of every prompt in one ragged batch per step (prefill, then one token per
    sequence per step)."""
    ids = list(range(len(prompts)))
    for i in ids:
        cache.claim(i)
    step = [list(p) for p in prompts]
    out: list[list[int]] = [[] for _ in prompts]
    for _ in range(max_new_tokens):
        lengths = [len(s) for s in step]
        tokens = np.concatenate([np.asarray(s, np.int64) for s in step])
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint32)
        logits = compiled.execute(tokens, offsets, np.ones(1, np.int64), *cache.inputs(ids, lengths))[0].to_numpy()
        cache.commit(ids, lengths)
        nxt = logits.argmax(-1)  # [batch]
        for i, t in enumerate(nxt):
            out[i].append(int(t))
        step = [[int(t)] for t in nxt]
    for i in ids:
        cache.release(i)
    return out


def main(argv: list[str] | None = None) -> tuple[list[list[int]], list[list[int]]]:
    """Runs the example; returns (the graph's greedy tokens, ``maxjax generate``'s) per prompt."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    from maxjax._bundled import smollm2_gguf_path
    from maxjax.models import load_model

    cases = json.loads(REFERENCE.read_text())["cases"]
    prompts = [cases["raw"]["prompt_ids"], cases["chat"]["prompt_ids"]]
    model, kv_params, _ = load(smollm2_gguf_path())
    compiled = InferenceSession().load(graph_of(model, kv_params), weights_registry=model.state_dict())
    pages = sum(-(-(len(p) + args.max_new_tokens) // kv_params.page_size) for p in prompts)
    got = greedy_ragged(compiled, PagedKVCache(kv_params, pages), prompts, args.max_new_tokens)
    lm = load_model()
    want = [g.token_ids for g in lm.generate_tokens(prompts, max_new_tokens=args.max_new_tokens, stop_at_eos=False)]
    for name, g, w in zip(("raw", "chat"), got, want):
        print(f"{name:5} MAX-style ragged graph: {g}\n{'':5} maxjax generate:        {w}  {'equal' if g == w else 'DIFFERENT'}")
    return got, want


if __name__ == "__main__":
    main()
