"""The one place structured logging is configured.

Logs go to stderr: JSON lines when stderr is not a terminal (for collectors),
a readable console rendering when it is.  Context bound with
``structlog.contextvars.bind_contextvars`` is merged into every event.  Call
``configure`` once, from the entry point; modules only call
``structlog.get_logger()``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

__all__ = ["LEVELS", "configure"]

LEVELS = ("debug", "info", "warning", "error", "critical")
"""Accepted level names, most verbose first."""


class _StderrLogger:
    """Writes each rendered event to whatever ``sys.stderr`` is at the time.

    Looking the stream up per call (instead of binding it once) keeps log
    lines readable while a ``rich`` live display temporarily wraps stderr.
    """

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def _factory(*_args: Any) -> _StderrLogger:
    return _StderrLogger()


LIBRARY_LOGGERS = ("kubernetes_asyncio",)
"""Libraries that log through ``logging`` what they then raise (an exec credential plugin's
failure): with no handler of ours, Python's last-resort handler printed it raw on stderr, a
line before gpusched's own error saying the same."""


class _ToStructlog(logging.Handler):
    """Hands a library's log records to structlog, at debug: what they say comes back in
    gpusched's own error or warning, and ``--log-level debug`` still shows them as written.
    ``loud`` (a daemon's log, at info or lower): its errors as warnings, since not every one is
    raised after it (an exec plugin's output without a token: only a 401 follows)."""

    def __init__(self, loud: bool = False) -> None:
        super().__init__()
        self.loud = loud

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level = record.levelname.lower()
            log = structlog.get_logger()
            if self.loud and record.levelno >= logging.ERROR:
                log.warning(record.getMessage(), logger=record.name, library_level=level)
            else:
                log.debug(record.getMessage(), logger=record.name, library_level=level)
        except Exception:
            self.handleError(record)


def configure(level: str = "warning", *, json: bool | None = None) -> None:
    """Configure structlog for the process.

    ``level`` is one of ``LEVELS``; ``json`` forces the renderer (default:
    JSON unless stderr is a terminal).
    """
    name = level.strip().lower()
    if name not in LEVELS:
        raise ValueError(f"unknown log level {level!r}; choose from {', '.join(LEVELS)}")
    if json is None:
        json = not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=True)
    )
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    if json:
        processors.append(structlog.processors.dict_tracebacks)
    processors.append(renderer)
    for library in LIBRARY_LOGGERS:
        logger = logging.getLogger(library)
        loud = name in ("debug", "info")
        logger.handlers = [h for h in logger.handlers if not isinstance(h, _ToStructlog)] + [_ToStructlog(loud)]
        logger.propagate = False  # nor up to the root, where the last-resort handler prints it
        logger.setLevel(logging.DEBUG if name == "debug" else logging.WARNING)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[name.upper()]),
        logger_factory=_factory,
        cache_logger_on_first_use=False,
    )
