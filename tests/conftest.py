"""Test setup (after Equinox's): 8 CPU devices and strict dtype promotion for every test."""

import jax

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_dtype_promotion", "strict")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_leftover_hooks():
    """Layer hooks are module-global (as in MAX): make sure no test leaks one into the next."""
    from maxjax.nn.layer import clear_hooks

    yield
    clear_hooks()


@pytest.fixture(scope="session")
def smollm2():
    """The bundled SmolLM2 (``load_model()``), loaded once per test session for the modules that
    share it (its jitted steps compile once for all of them)."""
    from maxjax.models import load_model

    return load_model()


@pytest.fixture(scope="session")
def tiny_q4_0(tmp_path_factory):
    """A tiny Llama GGUF in Q4_0 (``scripts/make_synthetic_gguf.py``'s ``tiny`` shape: 2 layers
    of 64 features, a 49152-token vocabulary), written once per test session."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import make_synthetic_gguf as synth

    return synth.write_gguf("tiny", "q4_0", tmp_path_factory.mktemp("synth") / "tiny-q4_0.gguf", verbose=False)
