"""``maxjax.nn.transformer`` (MAX's ``max.nn.transformer``): decoder blocks and stacks."""

from maxjax.nn.transformer.post_norm import FeedForward, PostNormTransformerBlock
from maxjax.nn.transformer.transformer import (
    ReturnHiddenStates, ReturnLogits, Transformer, TransformerBlock, forward_sequential_layers, logits_postprocess,
)
from maxjax.nn.transformer.distributed_transformer import (
    DistributedLogitsPostprocessMixin, DistributedTransformer, DistributedTransformerBlock, distributed_logits_postprocess,
)

__all__ = [
    "FeedForward", "PostNormTransformerBlock", "ReturnHiddenStates", "ReturnLogits", "Transformer", "TransformerBlock", "forward_sequential_layers",
    "logits_postprocess",
    "DistributedLogitsPostprocessMixin", "DistributedTransformer", "DistributedTransformerBlock", "distributed_logits_postprocess",
]  # fmt: skip
