"""Encoder pieces MAX keeps inside its BERT architecture (``max/pipelines/architectures/bert/
graph.py``: ``BertLayer``, ``BertIntermediate`` + ``BertOutput``) as layers usable alone: a
post-norm transformer block and the non-gated feed-forward it holds.

Post-norm (Vaswani et al., 2017, "Attention Is All You Need", section 3.1; Devlin et al., 2019,
BERT) normalises after each residual sum, where MAX's :class:`TransformerBlock` (pre-norm, Llama)
normalises before each sub-layer::

    h   = attention_norm(x + attention(x, attention_mask=mask))     # [batch, seq, hidden]
    out = mlp_norm(h + mlp(h))                                       # [batch, seq, hidden]
"""

from __future__ import annotations

from typing import Any

from maxjax.dtype import DType
from maxjax.graph import DeviceRef
from maxjax.nn.activation import activation_function_from_name
from maxjax.nn.layer import Module
from maxjax.nn.linear import Linear

__all__ = ["FeedForward", "PostNormTransformerBlock"]


class FeedForward(Module):
    """The non-gated feed-forward of BERT-style encoders: ``down_proj(act(up_proj(x)))``.

    MAX's :class:`~maxjax.nn.MLP` is gated (``down(act(gate(x)) * up(x))``); this one is not.

    Args:
        dtype: the weights' dtype.
        device: their device.
        hidden_dim: the model dimension (input and output size).
        feed_forward_length: the inner size.
        activation_function: a name from :func:`~maxjax.nn.activation.activation_function_from_name`
            (``"gelu"`` is the exact erf GELU of BERT).
        has_bias: both projections have biases (BERT's do).

    Weights: ``up_proj.weight [feed_forward_length, hidden_dim]``, ``down_proj.weight [hidden_dim,
    feed_forward_length]`` (and ``.bias``).

    ``__call__(x)``: ``[..., hidden_dim]`` -> ``[..., hidden_dim]``.

    Raises:
        ValueError: an unknown ``activation_function`` (MAX's message).
    """

    def __init__(
        self,
        dtype: DType,
        device: DeviceRef,
        hidden_dim: int,
        feed_forward_length: int,
        activation_function: str = "gelu",
        has_bias: bool = True,
    ) -> None:
        super().__init__()
        self.act = activation_function_from_name(activation_function)
        self.activation_function = activation_function
        self.up_proj = Linear(hidden_dim, feed_forward_length, dtype, device, has_bias=has_bias)
        self.down_proj = Linear(feed_forward_length, hidden_dim, dtype, device, has_bias=has_bias)

    def __call__(self, x: Any) -> Any:
        return self.down_proj(self.act(self.up_proj(x)))  # [..., ffl] -> [..., hidden_dim]


class PostNormTransformerBlock(Module):
    """A post-norm encoder block (see the module docstring), with the children's names of MAX's
    :class:`~maxjax.nn.TransformerBlock` (``attention``, ``mlp``, ``attention_norm``, ``mlp_norm``).

    Args:
        attention: called as ``attention(x, attention_mask=mask)`` (e.g.
            :class:`~maxjax.nn.MultiheadAttention`, bidirectional with a padding mask).
        mlp: ``[..., hidden] -> [..., hidden]`` (e.g. :class:`FeedForward`).
        attention_norm, mlp_norm: norms applied after each residual sum (e.g.
            :class:`~maxjax.nn.LayerNorm` with a bias).

    ``__call__(x, attention_mask=None)``: x ``[batch, seq, hidden]``, attention_mask integer
    ``[batch, seq]`` (1: a token, 0: padding; None: every position) -> ``[batch, seq, hidden]``.
    """

    def __init__(self, attention: Any, mlp: Any, attention_norm: Any, mlp_norm: Any) -> None:
        super().__init__()
        self.attention = attention
        self.mlp = mlp
        self.attention_norm = attention_norm
        self.mlp_norm = mlp_norm

    def __call__(self, x: Any, attention_mask: Any = None) -> Any:
        h = self.attention_norm(x + self.attention(x, attention_mask=attention_mask))  # [b, s, hidden]
        return self.mlp_norm(h + self.mlp(h))  # [b, s, hidden]
