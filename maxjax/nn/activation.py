"""``activation_function_from_name`` and ``GatedActivation`` (MAX's ``max.nn.activation``)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from maxjax.graph import ops

__all__ = ["GatedActivation", "activation_function_from_name"]

_ACTIVATIONS: dict[str, Callable[[Any], Any]] = {
    "silu": ops.silu,
    "gelu": ops.gelu,
    "gelu_tanh": partial(ops.gelu, approximate="tanh"),
    "relu": ops.relu,
    "tanh": ops.tanh,
    "sigmoid": ops.sigmoid,
}


def activation_function_from_name(name: str) -> Callable[[Any], Any]:
    """The op named ``name``: ``silu``, ``gelu`` (exact, erf), ``gelu_tanh`` (tanh approximation),
    ``relu``, ``tanh`` or ``sigmoid`` (MAX's table).

    Raises:
        ValueError: any other name (MAX's message: ``Unrecognized activation function name (x)``).
    """
    fn = _ACTIVATIONS.get(name)
    if fn is None:
        raise ValueError(f"Unrecognized activation function name ({name})")
    return fn


_FUSED_ACTIVATION_CONSTANTS: dict[str, tuple[str, ...]] = {"silu": ("limit",), "swigluoai": ("alpha", "limit"), "gelu_tanh": ()}


@dataclass(frozen=True)
class GatedActivation:
    """The gated activation between an MoE's gate-up and down projections (MAX's
    ``max.nn.activation.GatedActivation``, re-exported by ``max.nn.moe``).

    ``fused_activation`` (what MAX's fused kernels compute, named like the HF ``hidden_act``), on
    ``gate`` and ``up`` halves of the gate-up projection:

    - ``"silu"``: ``silu(gate) * up``; a non-zero ``limit`` first clamps ``gate`` to
      ``min(gate, limit)`` and ``up`` to ``[-limit, limit]``.
    - ``"swigluoai"``: ``g * sigmoid(alpha * g) * (u + 1)`` with ``g = min(gate, limit)`` and
      ``u = clamp(up, -limit, limit)``.
    - ``"gelu_tanh"``: ``gelu(gate) * up`` (tanh approximation).

    ``gated_activation_fn(gate_up [rows, 2 * moe_dim], moe_dim) -> [rows, moe_dim]`` replaces
    the activation with graph ops.

    Raises:
        ValueError: MAX's checks: an unknown ``fused_activation``, a constant the activation does
            not take, a negative ``limit``, ``swigluoai`` without ``alpha`` and ``limit``, or a
            ``gated_activation_fn`` with non-default fused settings.
    """

    fused_activation: str = "silu"
    alpha: float = 0.0
    limit: float = 0.0
    gated_activation_fn: Callable[[Any, int], Any] | None = None

    def __post_init__(self) -> None:
        name = self.fused_activation
        if name not in _FUSED_ACTIVATION_CONSTANTS:
            raise ValueError(f"fused_activation must be one of {tuple(_FUSED_ACTIVATION_CONSTANTS)}, got {name!r}")
        takes = _FUSED_ACTIVATION_CONSTANTS[name]
        for constant in ("alpha", "limit"):
            if getattr(self, constant) != 0.0 and constant not in takes:
                raise ValueError(f"{name} takes no {constant}")
        if self.limit < 0.0:
            raise ValueError(f"limit must be non-negative, got {self.limit}")
        if name == "swigluoai" and (self.alpha == 0.0 or self.limit == 0.0):
            raise ValueError("swigluoai needs a non-zero alpha and limit")
        if self.gated_activation_fn is not None and (name != "silu" or self.limit != 0.0):
            raise ValueError(
                "a gated_activation_fn replaces the fused activation; leave fused_activation, alpha, and limit at their defaults"
            )

    def kernel_parameters(self) -> dict[str, float | str]:
        """``fused_activation`` as MAX's kernel parameters (``activation``, ``swiglu_alpha``,
        ``swiglu_limit``).

        Raises:
            ValueError: ``gated_activation_fn`` is set (MAX's message).
        """
        if self.gated_activation_fn is not None:
            raise ValueError("a gated_activation_fn runs as graph ops and cannot be fused into a kernel")
        return {"activation": self.fused_activation, "swiglu_alpha": float(self.alpha), "swiglu_limit": float(self.limit)}
