"""How the ``mrc-nic`` command reports a user error: one line on stderr, exit status 2."""

import sys

__all__ = ["fail"]


def fail(message, *, status=2):
    """Print ``mrc-nic: error: <message>`` on stderr and return ``status`` (the exit status)."""
    # One line, so scripts can show it as is: newlines inside a message would split it.
    print(f"mrc-nic: error: {' '.join(str(message).split())}", file=sys.stderr)
    return status
