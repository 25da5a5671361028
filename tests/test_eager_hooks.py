"""Layer hooks in eager mode see every layer of a scanned model (``ops.call`` runs the layer at its
prefix), while graph mode keeps MAX's behaviour (issue 15)."""

from __future__ import annotations

import numpy as np

from maxjax import nn
from maxjax.graph import Graph, TensorType
from maxjax.dtype import DType
from maxjax.nn.layer import add_layer_hook
from train_util import TINY, tiny_model, tokens


def _block_hook(seen):
    def hook(layer, args, kwargs, out):
        if isinstance(layer, nn.TransformerBlock):
            seen.append(out[0])

    return hook


def test_eager_hooks_see_every_layers_concrete_output_and_can_replace_it():
    model = tiny_model(0)
    toks = tokens(1, 6)
    seen = []
    with add_layer_hook(_block_hook(seen)):
        logits = np.asarray(model(toks))
    concrete = [h for h in seen if h._graph is None]
    assert len(concrete) == TINY.num_hidden_layers  # every layer, not just layers.0
    assert all(h.to_numpy().shape == (1, 6, TINY.hidden_size) for h in concrete)
    assert len({float(np.abs(h.to_numpy()).sum()) for h in concrete}) == TINY.num_hidden_layers
    # the last layer's output, normed and projected, is the logits (what a notebook user checks)
    state = nn.state(model)
    h = concrete[-1].to_numpy()
    normed = h / np.sqrt((h * h).mean(-1, keepdims=True) + TINY.rms_norm_eps) * np.asarray(state["norm.weight"])
    np.testing.assert_allclose(normed @ np.asarray(state["lm_head.weight"]).T, logits, rtol=1e-4, atol=1e-4)

    def zero_layer_1(layer, args, kwargs, out):  # a hook that returns a value replaces the output
        if layer is model.layers[1]:
            return (out[0] * 0, *out[1:])

    with add_layer_hook(zero_layer_1):
        changed = np.asarray(model(toks))
    assert not np.allclose(changed, logits)


def test_graph_mode_hooks_see_graph_values_once_per_traced_layer():
    model = tiny_model(0)
    model.raw_state_dict()
    seen = []
    with add_layer_hook(_block_hook(seen)):
        Graph("g", forward=model, input_types=[TensorType(DType.int32, ["batch", "seq"])])
    assert len(seen) == 1 and seen[0]._graph is not None  # the subgraph is traced from layer 0 once
