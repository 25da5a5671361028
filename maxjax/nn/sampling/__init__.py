"""``maxjax.nn.sampling``: MAX 26.7's ``max.nn.sampling`` (token samplers and speculative-decoding
acceptance), as far as they are plain math.

Built on maxjax ops (each sampler's math is one jnp function dispatched by
:func:`maxjax.graph.ops._core.apply`), so they run in graph, functional (``jax.jit``) and eager
mode. Random draws: MAX's kernels draw from their own generator (``MinPSampler``: no seed input;
``RejectionSampler``: seeded with the graph's seed); maxjax draws with ``jax.random`` keyed by the
seed it is given (``seed=`` argument), so the deterministic paths (greedy, ``top_k=1``,
``min_p=1``) give MAX's tokens and the random ones give draws from the same distribution, not
MAX's numbers; ``RejectionSamplerWithResiduals`` with its ``rejection_rand``/``residual_rand``
uniforms given, and the synthetic sampler at rates 0 and 1, are deterministic too.
``stochastic_acceptance_sampler`` (MAX's fused stochastic sampling kernels, relaxed acceptance,
sampled draft proposals) is not built; ``AcceptanceSampler`` refuses the options that need it.
"""

from maxjax.nn.sampling.min_p import MinPSampler
from maxjax.nn.sampling.penalties import LogitPenalties
from maxjax.nn.sampling.rejection_sampler import (
    AcceptanceSampler,
    RejectionSampler,
    RejectionSamplerWithResiduals,
    compute_synthetic_acceptance_base_rate,
    greedy_acceptance_sampler,
    synthetic_acceptance_sampler,
)

__all__ = [
    "AcceptanceSampler",
    "LogitPenalties",
    "MinPSampler",
    "RejectionSampler",
    "RejectionSamplerWithResiduals",
    "compute_synthetic_acceptance_base_rate",
    "greedy_acceptance_sampler",
    "synthetic_acceptance_sampler",
]
