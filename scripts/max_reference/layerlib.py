"""MAX 26.7 reference for the layer library's hooks and sampling (area ``layerlib``).

- ``print_*``: what ``PrintHook`` prints (MAX's runtime print, captured from fd 1) for a small
  Linear + RMSNorm block in a graph, and ``ops.print`` of tensors of several ranks and dtypes.
- ``greedy_*``: ``greedy_acceptance_sampler`` with and without a packed grammar bitmask.
- ``rej_*``: ``RejectionSampler(top_k=1)`` (deterministic: the recovered token is the argmax).
- ``minp_*``: ``MinPSampler`` with ``min_p=1.0`` (only the most likely token survives).
- ``pen_*``: ``LogitPenalties.apply`` (presence/frequency penalties over a CSR of counts).
- ``base_rate``: ``compute_synthetic_acceptance_base_rate`` on a grid.
- ``res_*``: ``RejectionSamplerWithResiduals`` with given acceptance and residual uniforms.
- ``syn0_*``, ``syn1_*``, ``acc_*``: ``synthetic_acceptance_sampler`` at rates 0 and 1 and
  ``AcceptanceSampler(synthetic_acceptance_rate=1.0)`` (no randomness left at those rates).
"""

from __future__ import annotations

import os
import tempfile

import numpy as np


def _capture_fd1(fn):
    """Runs ``fn()`` with fd 1 redirected to a file; returns (result, text written)."""
    import sys

    sys.stdout.flush()
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(1)
        os.dup2(tmp.fileno(), 1)
        try:
            out = fn()
            sys.stdout.flush()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        return out, tmp.read().decode()


def _print_reference(out: dict) -> None:
    from max import nn
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops
    from max.nn.hooks import PrintHook

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2, DType.float32, DeviceRef.CPU(), has_bias=True)
            self.norm = nn.RMSNorm(2, DType.float32)

        def __call__(self, x):
            return self.norm(self.lin(x)), x

    w = {"lin.weight": np.arange(6, dtype=np.float32).reshape(2, 3) / 10, "lin.bias": np.array([0.5, -1], np.float32),
         "norm.weight": np.array([1, 2], np.float32)}
    x = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    m = Block()
    m.load_state_dict(w)
    hook = PrintHook()
    hook.name_layers(m)
    g = Graph("hooked", input_types=[TensorType(DType.float32, [2, 3], DeviceRef.CPU())])
    with g:
        h, _ = m(g.inputs[0].tensor)
        h2 = m.lin(g.inputs[0].tensor)
        g.output(h, h2)
    hook.remove()
    model = InferenceSession().load(g, weights_registry=m.state_dict())
    _, text = _capture_fd1(lambda: model.execute(x))
    out.update({f"print_w_{k}": v for k, v in w.items()})
    out["print_x"] = x
    out["print_hook_text"] = np.asarray(text)
    out["print_hook_names"] = np.asarray("\n".join(hook._recorded_prints[0]))

    tensors = {
        "r0": np.array(3.14159, np.float32),
        "r1": np.array([-1.5, 2.25, 1e-5, 12345.678], np.float32),
        "r3": (np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 10) / 3,
        "big": np.arange(2000, dtype=np.float32).reshape(20, 100) / 7,
        "d3big": np.arange(32, dtype=np.float32).reshape(8, 2, 2),
        "r4": np.arange(16, dtype=np.float32).reshape(2, 2, 2, 2),
        "n6": np.arange(6, dtype=np.float32),
        "n7": np.arange(7, dtype=np.float32),
        "rows7": np.arange(14, dtype=np.float32).reshape(7, 2),
        "special": np.array([np.nan, np.inf, -np.inf, 1e10, -0.0, 1.23456789e-3], np.float32),
        "i32": np.array([[1, -2, 3], [40, 500, -6000]], np.int32),
        "i64": np.array([1, 2], np.int64),
        "u8": np.array([1, 255], np.uint8),
        "f16": np.array([1.5, 2.0], np.float16),
        "f64": np.array([1.5, 2.0], np.float64),
        "b": np.array([True, False]),
        "e0": np.zeros((0, 3), np.float32),
    }
    g = Graph("prints", input_types=[TensorType(DType.from_numpy(v.dtype), v.shape, DeviceRef.CPU()) for v in tensors.values()])
    with g:
        for name, v in zip(tensors, g.inputs):
            ops.print(v.tensor, name)
        g.output(g.inputs[0].tensor)
    model = InferenceSession().load(g)
    _, text = _capture_fd1(lambda: model.execute(*tensors.values()))
    out.update({f"fmt_in_{k}": v for k, v in tensors.items()})
    out["fmt_names"] = np.asarray(list(tensors))
    out["fmt_text"] = np.asarray(text)


def _sampling_reference(out: dict) -> None:
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType
    from max.nn.sampling import LogitPenalties, MinPSampler, RejectionSampler, greedy_acceptance_sampler

    rng = np.random.default_rng(21)
    batch, steps, vocab = 3, 4, 40
    cpu = DeviceRef.CPU()
    target = rng.standard_normal((batch * (steps + 1), vocab)).astype(np.float32)
    am = target.reshape(batch, steps + 1, vocab).argmax(-1)
    draft = am[:, :steps].copy()
    draft[0, 2] = (draft[0, 2] + 1) % vocab  # row 0 rejected at 2, row 1 all accepted, row 2 at 0
    draft[2, 0] = (draft[2, 0] + 5) % vocab
    draft = draft.astype(np.int64)
    bits = rng.integers(0, 2, (batch, steps + 1, vocab)).astype(bool)
    bits[..., 0] = True
    packed = np.zeros((batch, steps + 1, 2), np.uint32)
    for t in range(vocab):
        packed[..., t // 32] |= bits[..., t].astype(np.uint32) << np.uint32(t % 32)
    packed = packed.view(np.int32)
    # rejection sampler: flat target logits with offsets (batch + 1), draft logits of the drafted tokens
    offsets = np.arange(0, batch * (steps + 1) + 1, steps + 1, dtype=np.int64)
    draft_logit = np.take_along_axis(target.reshape(batch, steps + 1, vocab)[:, :steps], draft[..., None], -1)[..., 0]
    draft_logit = draft_logit + np.array([[0, 0, 1, 0], [0, 0, 0, 0], [0, 2, 0, 0]], np.float32)  # rejected where > target + eps
    seed = np.array([7], np.uint64)
    # min-p: logits [batch, vocab]
    minp_logits = rng.standard_normal((batch, vocab)).astype(np.float32)
    # penalties: CSR [token, count] rows; -1 is padding
    pen_logits = rng.standard_normal((batch, vocab)).astype(np.float32)
    pen_data = np.array([[3, 2], [5, 1], [-1, 4], [3, 1], [39, 3], [0, 1]], np.int32)
    pen_offsets = np.array([0, 3, 3, 6], np.uint32)
    pen_freq = np.array([0.5, 1.0, 0.25], np.float32)
    pen_pres = np.array([1.5, 0.0, 2.0], np.float32)

    # MAX's samplers rebind to their own symbolic dims (batch_size, num_steps, vocab_size): symbolic inputs
    types = [
        TensorType(DType.int64, ["batch_size", "num_steps"], cpu), TensorType(DType.float32, ["rows", "vocab_size"], cpu),
        TensorType(DType.int32, ["batch_size", "steps1", "packed_vocab_size"], cpu),
        TensorType(DType.float32, ["batch_size", "num_steps"], cpu),
        TensorType(DType.int64, ["offsets"], cpu), TensorType(DType.uint64, [1], cpu),
        TensorType(DType.float32, ["batch_size", "vocab_size"], cpu), TensorType(DType.float32, ["penalty_rows", "vocab_size"], cpu),
        *LogitPenalties.input_types(cpu),
    ]
    with Graph("sampling", input_types=types) as g:
        d, t, pk, dl, off, sd, ml, pl, *pen = (v.tensor for v in g.inputs)
        r0 = greedy_acceptance_sampler(d, t)
        r1 = greedy_acceptance_sampler(d, t, pk)
        rj = RejectionSampler(cpu)(d, dl, t, off, sd)
        mp = MinPSampler(DType.float32, ["batch_size", 1])(ml, 1.0)
        pe = LogitPenalties.from_inputs(pen).apply(pl)
        g.output(*r0, *r1, *rj, mp, pe)
    res = InferenceSession().load(g).execute(draft, target, packed, draft_logit, offsets, seed, minp_logits, pen_logits,
                                             pen_data, pen_offsets, pen_freq, pen_pres)
    res = [r.to_numpy() for r in res]
    out.update(
        greedy_draft=draft, greedy_target=target, greedy_packed=packed,
        greedy_first=res[0], greedy_recovered=res[1], greedy_bonus=res[2],
        greedy_mask_first=res[3], greedy_mask_recovered=res[4], greedy_mask_bonus=res[5],
        rej_draft_logits=draft_logit, rej_offsets=offsets, rej_seed=seed, rej_first=res[6], rej_token=res[7],
        minp_logits=minp_logits, minp_tokens=res[8],
        pen_logits=pen_logits, pen_data=pen_data, pen_offsets=pen_offsets, pen_freq=pen_freq, pen_pres=pen_pres, pen_out=res[9],
    )


def _residual_reference(out: dict) -> None:
    """``RejectionSamplerWithResiduals`` with given uniforms (accept mask and residual draw fixed)
    and ``synthetic_acceptance_sampler`` at rates 0 and 1 (no randomness left)."""
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType
    from max.nn.sampling import AcceptanceSampler, RejectionSamplerWithResiduals, synthetic_acceptance_sampler

    rng = np.random.default_rng(5)
    batch, steps, vocab = 3, 4, 12
    cpu = DeviceRef.CPU()
    target = (rng.standard_normal((batch * (steps + 1), vocab)) * 2).astype(np.float32)
    all_draft = (rng.standard_normal((steps, batch, vocab)) * 2).astype(np.float32)
    t3 = target.reshape(batch, steps + 1, vocab)
    all_draft[:, 1] = t3[1, :steps]  # row 1 drafts with the target's own distribution: all accepted
    all_draft[:2, 2] = t3[2, :2] + 0.05  # row 2: close for two steps, then its own
    draft = np.ascontiguousarray(all_draft.argmax(-1).T.astype(np.int64))  # [batch, steps]: the draft's own argmax
    draft_logit = np.ascontiguousarray(np.take_along_axis(all_draft.transpose(1, 0, 2), draft[..., None], -1)[..., 0])
    offsets = np.arange(0, batch * (steps + 1) + 1, steps + 1, dtype=np.int64)
    seed = np.array([11], np.uint64)
    rejection_rand = rng.uniform(size=(batch, steps)).astype(np.float32)
    rejection_rand[0, 0] = 1e-3  # row 0: a tiny uniform accepts even an unlikely first draft
    residual_rand = rng.uniform(size=(batch, steps, vocab)).astype(np.float32)
    types = [
        TensorType(DType.int64, ["batch_size", "num_steps"], cpu), TensorType(DType.float32, ["batch_size", "num_steps"], cpu),
        TensorType(DType.float32, ["rows", "vocab_size"], cpu), TensorType(DType.int64, ["offsets"], cpu),
        TensorType(DType.float32, ["num_steps", "batch_size", "vocab_size"], cpu), TensorType(DType.uint64, [1], cpu),
        TensorType(DType.float32, ["batch_size", "num_steps"], cpu),
        TensorType(DType.float32, ["batch_size", "num_steps", "vocab_size"], cpu),
    ]
    with Graph("residuals", input_types=types) as g:
        d, dl, t, off, ad, sd, rr, rs = (v.tensor for v in g.inputs)
        res = RejectionSamplerWithResiduals(cpu)(d, dl, t, off, ad, sd, rejection_rand=rr, residual_rand=rs)
        s0 = synthetic_acceptance_sampler(d, t, 0.0, steps, sd)
        s1 = synthetic_acceptance_sampler(d, t, 1.0, steps, sd)
        ac = AcceptanceSampler(synthetic_acceptance_rate=1.0, num_draft_steps=steps)(d, t, seed=sd)
        g.output(*res, *s0, *s1, *ac)
    r = [x.to_numpy() for x in InferenceSession().load(g).execute(draft, draft_logit, target, offsets, all_draft, seed,
                                                                    rejection_rand, residual_rand)]
    out.update(
        res_target=target, res_all_draft=all_draft, res_draft=draft, res_draft_logit=draft_logit, res_offsets=offsets,
        res_seed=seed, res_rejection_rand=rejection_rand, res_residual_rand=residual_rand,
        res_first=r[0], res_recovered=r[1], res_bonus=r[2],
        syn0_first=r[3], syn0_recovered=r[4], syn0_bonus=r[5], syn1_first=r[6], syn1_recovered=r[7], syn1_bonus=r[8],
        acc_first=r[9], acc_recovered=r[10], acc_bonus=r[11],
    )


def build() -> dict[str, np.ndarray]:
    from max.nn.sampling import compute_synthetic_acceptance_base_rate

    out: dict[str, np.ndarray] = {}
    grid = [(p, n) for p in (0.0, 0.3, 0.5, 0.8, 0.95, 1.0) for n in (1, 3, 5)]
    out["base_rate_in"] = np.array(grid, np.float64)
    out["base_rate"] = np.array([compute_synthetic_acceptance_base_rate(p, int(n)) for p, n in grid])
    _sampling_reference(out)
    _residual_reference(out)
    _print_reference(out)
    return out
