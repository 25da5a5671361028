"""The ``maxjax`` command line: one module per subcommand, all listed in :data:`SUBCOMMANDS`.

Each subcommand module has ``configure(parser)`` (its arguments) and ``run(args)`` (returns the
exit status). On bad input a subcommand raises ``ValueError``/``OSError``/``KeyError`` (or
:class:`CLIError`); :func:`main` prints a one-line error to stderr and exits with status 1,
without a traceback.

    maxjax generate "The quick brown fox"     # maxjax.cli.generate
    maxjax inspect model.gguf                 # maxjax.cli.inspect
    maxjax serve --port 8000                  # maxjax.cli.serve
    maxjax embed "A sentence" "Another one"   # maxjax.cli.embed
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from dataclasses import dataclass
from typing import Sequence

from maxjax.cli.errors import CLIError

__all__ = ["main", "CLIError", "Subcommand", "SUBCOMMANDS", "build_parser"]


@dataclass(frozen=True)
class Subcommand:
    """One ``maxjax`` subcommand: its name, one-line help, and the module (under ``maxjax.cli``)
    with its ``configure(parser)`` and ``run(args)`` (imported when the subcommand is built)."""

    name: str
    help: str
    module: str

    def load(self) -> object:
        return importlib.import_module(f"maxjax.cli.{self.module}")


#: The subcommands, in the order ``maxjax --help`` lists them.
SUBCOMMANDS: list[Subcommand] = [
    Subcommand("generate", "generate text with a language model (default: the bundled SmolLM2)", "generate"),
    Subcommand("inspect", "list a checkpoint's metadata and tensors (GGUF, safetensors, orbax)", "inspect"),
    Subcommand("embed", "sentence embeddings with a sentence encoder (default: the bundled all-MiniLM-L6-v2)", "embed"),
    Subcommand("serve", "serve a language model over an OpenAI-compatible HTTP API (continuous batching)", "serve"),
]


def build_parser() -> argparse.ArgumentParser:
    """The ``maxjax`` argument parser, one sub-parser per entry of :data:`SUBCOMMANDS`."""
    parser = argparse.ArgumentParser(prog="maxjax", description="maxjax: MAX's Python API on JAX")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for cmd in SUBCOMMANDS:
        module = cmd.load()
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        module.configure(p)  # type: ignore[attr-defined]
        p.set_defaults(_run=module.run)  # type: ignore[attr-defined]
    return parser


def _one_line(e: BaseException) -> str:
    text = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
    text = " ".join(str(text).split())
    return text or type(e).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``maxjax`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    0: success; 1: bad input (a one-line error on stderr); 2: bad usage (argparse's message).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    run = getattr(args, "_run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(run(args) or 0)
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:  # pragma: no cover
            pass
        return 0
    except (CLIError, ValueError, NotImplementedError, OSError, KeyError) as e:
        print(f"maxjax {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
