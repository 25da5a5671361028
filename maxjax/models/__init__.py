"""Real architectures assembled from ``maxjax.nn`` (one folder each, see :mod:`maxjax.models.registry`)
and what runs them: :class:`CausalLM`, :func:`load_model`, the pure :class:`DecoderFunctions`.
"""

from maxjax.models import llama  # noqa: F401  (registers the architecture)
from maxjax.models import bert  # noqa: F401  (registers the encoder architecture)
from maxjax.models.causal_lm import CausalLM, Generation
from maxjax.models.decoding import DecoderFunctions
from maxjax.models.encoders import load_encoder
from maxjax.models.llama import LlamaConfig, LlamaForCausalLM, build_llama
from maxjax.models.loading import load_model, resolve_model_path
from maxjax.models.registry import Architecture, architectures, register

__all__ = [
    "Architecture", "CausalLM", "DecoderFunctions", "Generation", "LlamaConfig", "LlamaForCausalLM", "architectures",
    "build_llama", "load_model", "register", "resolve_model_path",
]  # fmt: skip
__all__ += ["load_encoder"]
