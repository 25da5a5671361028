"""The error a subcommand reports as one line."""

__all__ = ["CLIError"]


class CLIError(Exception):
    """A user error a subcommand reports as one line (exit status 1)."""
