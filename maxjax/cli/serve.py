"""``maxjax serve``: an OpenAI-compatible HTTP server with continuous batching (see :mod:`maxjax.serve`).

    maxjax serve                                   # bundled SmolLM2 on http://127.0.0.1:8000
    maxjax serve --model model.gguf --port 8080 --max-batch 32 --max-queue 128

It loads the model, compiles every shape the engine uses (``--no-warmup``: compile on first use),
then serves until SIGINT or SIGTERM: it stops accepting connections, lets requests in flight end
(streams are closed), and exits with status 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time

from maxjax.cli.devices import add_mesh_arguments, mesh_from_arguments
from maxjax.dtype import DType

__all__ = ["configure", "run"]

_DTYPES = {"float32": DType.float32, "bfloat16": DType.bfloat16}
_LAYOUTS = ("auto", "nibbles", "unpacked", "packed", "dequantized", "mapped", "tiles")


def _positive(kind: type, low: float) -> object:
    def parse(text: str) -> object:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {text}")
        return value

    return parse


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        metavar="PATH",
        help="a .gguf file, a Hugging Face model directory, or a repo id in the local Hugging Face cache "
        "(default: the bundled SmolLM2-135M-Instruct Q4_1 GGUF); or a sentence-transformers directory "
        "(serves /v1/embeddings)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=_positive(int, 0), default=8000, help="port to listen on (default 8000)")
    p.add_argument("--max-batch", type=_positive(int, 1), default=16, metavar="N", help="most requests decoded together (default 16)")
    p.add_argument(
        "--max-queue", type=_positive(int, 0), default=64, metavar="N",
        help="most requests waiting for a batch row; beyond, requests get HTTP 429 (default 64)",
    )  # fmt: skip
    p.add_argument(
        "--max-context", type=_positive(int, 2), default=None, metavar="N",
        help="most tokens of a request, prompt plus completion (default: the model's context, at most 2048)",
    )  # fmt: skip
    p.add_argument(
        "--request-timeout", type=_positive(float, 0.001), default=600.0, metavar="S",
        help="seconds a request may take, queueing included (default 600)",
    )  # fmt: skip
    p.add_argument("--served-model-name", metavar="NAME", help="the model's id in the API (default: the model file's name)")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                   help="compile every shape before serving (default: on)")  # fmt: skip
    p.add_argument("--shutdown-timeout", type=_positive(float, 0), default=30.0, metavar="S",
                   help="seconds to let requests in flight finish on SIGTERM (default 30)")  # fmt: skip
    p.add_argument(
        "--compilation-cache", nargs="?", const="", default=None, metavar="DIR",
        help="keep compiled programs on disk and load them on the next start (default folder: $MAXJAX_CACHE_DIR "
        "or ~/.cache/maxjax/jax)",
    )  # fmt: skip
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="float32", help="activation and KV-cache dtype, and a Hugging Face checkpoint's weights' dtype (default float32)")
    p.add_argument("--quantized-layout", choices=_LAYOUTS, default="auto", help="how quantized weights sit in memory (see maxjax generate)")
    p.add_argument("--arithmetic", choices=("auto", "float32", "int8", "q8_0"), default="auto",
                   help="int8 dots for batched products of a quantized model, or q8_0 activations (see maxjax generate)")
    add_mesh_arguments(p)
    p.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="info", help="server log level")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from maxjax.models import load_model
    from maxjax.models.encoders import is_encoder_dir
    from maxjax.serve import Engine, create_app

    def say(msg: str) -> None:
        print(f"maxjax serve: {msg}", file=sys.stderr, flush=True)

    if args.compilation_cache is not None:
        from maxjax.engine import enable_compilation_cache

        say(f"compilation cache in {enable_compilation_cache(args.compilation_cache or None)}")
    if args.model is not None and is_encoder_dir(args.model):
        unused = [
            flag for flag, value, default in (
                ("--dtype", args.dtype, "float32"), ("--quantized-layout", args.quantized_layout, "auto"),
                ("--max-context", args.max_context, None), ("--mesh", args.mesh, None), ("--cpu-devices", args.cpu_devices, None),
                ("--arithmetic", args.arithmetic, "auto"),
            ) if value != default
        ]  # fmt: skip
        if unused:
            say(f"error: {', '.join(unused)} apply to text generation, not to an encoder (embeddings) model")
            return 2
        from maxjax.serve.encoder_server import serve_encoder

        return serve_encoder(
            args.model, host=args.host, port=args.port, max_batch=args.max_batch, max_queue=args.max_queue,
            served_model_name=args.served_model_name, warmup=args.warmup, shutdown_timeout=args.shutdown_timeout,
            log_level=args.log_level, request_timeout=args.request_timeout,
        )

    logger = logging.getLogger("maxjax.serve")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(args.log_level.upper())
    mesh = mesh_from_arguments(args)
    t0 = time.perf_counter()
    lm = load_model(
        args.model,
        dtype=_DTYPES[args.dtype],
        quantized_layout=None if args.quantized_layout == "auto" else args.quantized_layout,
        arithmetic=args.arithmetic,
        mesh=mesh,
    )
    engine = Engine(
        lm, max_batch=args.max_batch, max_queue=args.max_queue, max_context=args.max_context,
        request_timeout=args.request_timeout, warmup=args.warmup,
    )  # fmt: skip
    say(f"loaded {lm.source} in {time.perf_counter() - t0:.1f} s; batch buckets {engine.buckets.batch}, "
        f"cache buckets {engine.buckets.cache}, prompt buckets {engine.buckets.prompt}")  # fmt: skip
    if args.warmup:
        total = len(engine.steps.programs())
        say(f"compiling {total} programs")
        seconds = engine.warmup()
        say(f"compiled {total} programs in {seconds:.1f} s")
    app = create_app(engine, model_name=args.served_model_name, shutdown_grace=max(0.0, args.shutdown_timeout - 1.0))
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=args.shutdown_timeout,
    )  # fmt: skip
    server = uvicorn.Server(config)
    stopped_by: list[int] = []
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then raises the signal again with the handler
    # it found: with this one, a SIGTERM after a clean shutdown ends the process with status 0
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stopped_by.append(signum))
    say(f"serving {app.state.model_name} on http://{args.host}:{args.port}/v1 (max batch {engine.max_batch}, "
        f"max queue {engine.max_queue}, context {engine.context})")  # fmt: skip
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not server.started:
        return 1  # could not bind (uvicorn said why)
    say("stopped" + (" (SIGTERM)" if stopped_by else ""))
    return 0
