"""``maxjax.nn.hooks``: MAX 26.7's ``max.nn.hooks`` (``PrintHook``)."""

from maxjax.nn.hooks.base_print_hook import BasePrintHook, LayerInfo
from maxjax.nn.hooks.print_hook import PrintHook, format_tensor

__all__ = ["PrintHook"]
