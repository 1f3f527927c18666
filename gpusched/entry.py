"""The ``gpusched`` command (and ``python -m gpusched``): the CLI, and a quiet stop when Ctrl-C
comes while it is still loading.

Loading the CLI takes most of a second (the solver, the plotting and the YAML libraries); a
Ctrl-C in that time ends the command with one line and exit code 130, as it does later, rather
than with a traceback of the import under way.
"""

from __future__ import annotations

import sys

__all__ = ["EXIT_INTERRUPTED", "main"]

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command Ctrl-C ended


def main() -> int:
    """Load the CLI and run it; returns the process exit code."""
    try:
        from gpusched.cli import main as cli_main  # the load a Ctrl-C may cut short
    except KeyboardInterrupt:
        print("gpusched: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return cli_main()
