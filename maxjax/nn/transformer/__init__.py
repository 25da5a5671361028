"""``maxjax.nn.transformer`` (MAX's ``max.nn.transformer``): decoder blocks and stacks."""

from maxjax.nn.transformer.transformer import TransformerBlock

__all__ = ["TransformerBlock"]
