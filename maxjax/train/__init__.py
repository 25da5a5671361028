"""``maxjax.train``: training and fine-tuning (initializers live in :mod:`maxjax.nn.init`).

- :mod:`~maxjax.train.trainable`: float (trainable) copies of quantized modules; ``grad`` that
  names a quantized weight instead of failing inside JAX;
- :mod:`~maxjax.train.params`: train some weights, freeze the rest, by name pattern;
- :mod:`~maxjax.train.lora`: LoRA adapters on chosen ``Linear`` s, merged back for export;
- :mod:`~maxjax.train.trainer`: a compiled next-token train step (optax), data parallel on a mesh;
- :mod:`~maxjax.train.checkpoint`: Orbax checkpoints of a run, resumed to the identical next step;
- :mod:`~maxjax.train.export`: trained weights as a Hugging Face model directory (safetensors);
- :mod:`~maxjax.train.data`: text corpora split into training and held-out token streams;
- :mod:`~maxjax.train.interop`: Flax NNX states to maxjax names and back.
"""

from maxjax.train.lora import LoRALinear, apply_lora, lora_layers, lora_rank, merge_lora
from maxjax.train.params import matches, merge, select, split
from maxjax.train.trainable import check_differentiable, dequantized, grad, trainable_state, value_and_grad
from maxjax.train.trainer import Trainer, TrainState, next_token_loss

__all__ = [
    "LoRALinear", "TrainState", "Trainer", "apply_lora", "check_differentiable", "dequantized", "grad", "lora_layers",
    "lora_rank", "matches", "merge", "merge_lora", "next_token_loss", "select", "split", "trainable_state",
    "value_and_grad",
]  # fmt: skip
