"""``maxjax.nn``: MAX's module system (``Module``, ``LayerList``, hooks) and basic layers."""

from maxjax.nn.attention import AttentionWithRope, DistributedAttentionImpl, GGUFQAttentionWithRope, GPTQAttentionWithRope, MultiheadAttention, RaggedAttention
from maxjax.nn.attention import LatentAttentionWithRope, TensorParallelLatentAttentionWithRope
from maxjax.nn.comm import Allreduce, Signals
from maxjax.nn.conv import Conv1D, Conv2d, Conv3D
from maxjax.nn.conv_transpose import ConvTranspose1d, WeightNormConvTranspose1d
from maxjax.nn.embedding import Embedding
from maxjax.nn.embedding import VocabParallelEmbedding
from maxjax.nn.moe import MoE, MoEGate, forward_moe_sharded_layers
from maxjax.nn.functional import abstract_state, functional_call, state
from maxjax.nn.layer import HookHandle, Layer, LayerList, LayerV2, LoadStateDictResult, Module
from maxjax.nn.linear import MLP, Linear
from maxjax.nn.linear import ColumnParallelLinear, FusedMLP, GPTQLinear
from maxjax.nn.stacked_linear import StackedLinear
from maxjax.nn.clamp import clamp
from maxjax.nn.quant_config import InputScaleSpec, QuantConfig, QuantFormat, ScaleGranularity, ScaleOrigin, WeightScaleSpec
from maxjax.nn.norm import ConstantLayerNorm, GroupNorm, LayerNorm, RMSNorm
from maxjax.nn.rotary_embedding import (
    DynamicRotaryEmbedding, LinearScalingParams, Llama3RopeScalingParams, Llama3RotaryEmbedding, LongRoPERotaryEmbedding, LongRoPEScalingParams,
    RotaryEmbedding, YarnRotaryEmbedding, YarnScalingParams,
)
from maxjax.nn.transformer import (
    DistributedTransformer, DistributedTransformerBlock, FeedForward, PostNormTransformerBlock, ReturnHiddenStates,
    ReturnLogits, Transformer, TransformerBlock,
)  # fmt: skip
from maxjax.nn.attention import TensorParallelAttentionWithRope
from maxjax.nn.kv_cache import KVCacheInputs, KVCacheMetrics, KVCacheParams, build_max_lengths_tensors
from maxjax.nn.identity import Identity
from maxjax.nn.layer import MissingLayer, Shardable
from maxjax.nn.sequential import Sequential
from maxjax.nn.sampling import MinPSampler, RejectionSampler, RejectionSamplerWithResiduals
from maxjax.nn import hooks, sampling  # noqa: E402  (max.nn.hooks, max.nn.sampling)
from maxjax.nn import init  # noqa: E402  (initializers: nn.init.initialize(module, key))

__all__ = [
    "Allreduce", "AttentionWithRope", "DistributedAttentionImpl", "GGUFQAttentionWithRope", "GPTQAttentionWithRope", "MultiheadAttention", "KVCacheInputs", "KVCacheMetrics", "KVCacheParams", "RaggedAttention", "ReturnHiddenStates",
    "LatentAttentionWithRope", "TensorParallelLatentAttentionWithRope",
    "build_max_lengths_tensors",
    "ReturnLogits", "Transformer", "RotaryEmbedding", "LinearScalingParams", "Llama3RopeScalingParams",
    "Llama3RotaryEmbedding", "LongRoPERotaryEmbedding", "LongRoPEScalingParams", "YarnRotaryEmbedding", "DynamicRotaryEmbedding", "YarnScalingParams", "Signals", "TransformerBlock",
    "ConvTranspose1d", "WeightNormConvTranspose1d",
    "ConstantLayerNorm", "Conv1D", "Conv2d", "Conv3D", "Embedding", "GroupNorm", "HookHandle", "Layer", "LayerList", "LayerNorm", "LayerV2", "Linear", "LoadStateDictResult",
    "MLP", "Module", "RMSNorm", "Sequential", "abstract_state", "functional_call", "init", "state",
    "ColumnParallelLinear", "FusedMLP", "GPTQLinear", "StackedLinear", "clamp", "InputScaleSpec", "QuantConfig",
    "QuantFormat", "ScaleGranularity", "ScaleOrigin", "WeightScaleSpec",
    "Identity", "MissingLayer", "Shardable", "MinPSampler", "RejectionSampler", "RejectionSamplerWithResiduals",
    "MoE", "MoEGate", "forward_moe_sharded_layers", "VocabParallelEmbedding",
    "DistributedTransformer", "DistributedTransformerBlock", "TensorParallelAttentionWithRope",
    "FeedForward", "PostNormTransformerBlock",  # maxjax's: encoder pieces MAX keeps inside its BERT architecture
]  # fmt: skip
