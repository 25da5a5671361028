"""Real architectures assembled from ``maxjax.nn`` (Llama) and the serving API for them."""

from maxjax.models.llama import LlamaConfig, build_llama

__all__ = ["LlamaConfig", "build_llama"]
