"""Serving a sentence encoder over HTTP (``/v1/embeddings``): what ``maxjax serve --model DIR``
runs for an encoder directory (see :func:`serve_encoder`).

    python -m maxjax.serve.encoder_server --model DIR --port 8000 --max-batch 32
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Sequence

__all__ = ["serve_encoder", "main"]


def serve_encoder(
    model: str | None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_batch: int = 32,
    max_queue: int = 64,
    served_model_name: str | None = None,
    warmup: bool = True,
    shutdown_timeout: float = 30.0,
    log_level: str = "info",
    request_timeout: float = 600.0,
) -> int:
    """Loads the encoder of ``model`` (a sentence-transformers directory; None: the bundled
    all-MiniLM-L6-v2), compiles its shapes (``warmup``), and serves it with uvicorn until SIGINT
    or SIGTERM (requests in flight end first). Returns the exit status (1: could not bind).

    Raises:
        ValueError: the directory is not a loadable encoder (one line naming the file).
    """
    import uvicorn

    from maxjax.models import load_encoder
    from maxjax.serve.app import create_app
    from maxjax.serve.encoder_engine import EncoderEngine

    def say(msg: str) -> None:
        print(f"maxjax serve: {msg}", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    encoder = load_encoder(model)
    engine = EncoderEngine(encoder, max_batch=max_batch, max_queue=max_queue, request_timeout=request_timeout)
    say(f"loaded {encoder!r} in {time.perf_counter() - t0:.1f} s")
    if warmup:
        say(f"compiled the encoder's shapes in {engine.warmup():.1f} s")
    app = create_app(engine, model_name=served_model_name, shutdown_grace=max(0.0, shutdown_timeout - 1.0))
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=shutdown_timeout))
    stopped_by: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stopped_by.append(signum))
    say(f"serving {app.state.model_name} embeddings on http://{host}:{port}/v1 (max batch {max_batch}, max queue {max_queue})")
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not server.started:
        return 1
    say("stopped" + (" (SIGTERM)" if stopped_by else ""))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m maxjax.serve.encoder_server", description=__doc__.splitlines()[0])
    p.add_argument("--model", metavar="DIR")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--max-queue", type=int, default=64)
    p.add_argument("--served-model-name")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--shutdown-timeout", type=float, default=30.0)
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--log-level", default="info")
    a = p.parse_args(argv)
    try:
        return serve_encoder(
            a.model, host=a.host, port=a.port, max_batch=a.max_batch, max_queue=a.max_queue,
            served_model_name=a.served_model_name, warmup=a.warmup, shutdown_timeout=a.shutdown_timeout, log_level=a.log_level,
            request_timeout=a.request_timeout,
        )  # fmt: skip
    except ValueError as e:
        print(f"maxjax serve: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
