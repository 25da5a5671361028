"""``maxjax.nn.moe``: MAX 26.7's Mixture of Experts (``max.nn.moe``): ``MoE``, ``MoEGate``, the gated
activations and ``forward_moe_sharded_layers``.

Not present (MAX 26.7 has them, for GPU kernels maxjax does not have): ``MoEQuantized``,
``StackedMoE``, ``SigmoidTopKRouter``, the quantization strategies and EPLB helpers.
"""

from maxjax.nn.moe.expert_parallel import forward_moe_sharded_layers
from maxjax.nn.moe.moe import (
    GatedActivation, MoE, MoEGate, make_concatenated_gated_activation_fn, make_interleaved_gated_activation_fn,
)

__all__ = [
    "GatedActivation", "MoE", "MoEGate", "forward_moe_sharded_layers", "make_concatenated_gated_activation_fn",
    "make_interleaved_gated_activation_fn",
]  # fmt: skip
