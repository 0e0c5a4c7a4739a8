"""Structured JSON logs (structlog) with run/actor/island/candidate ids bound per message."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any, TextIO

import structlog

_configured = False


def configure_logging(
    *, level: str = "info", json: bool = True, stream: TextIO | None = None, file: str | None = None
) -> None:
    """Configure structlog once per process: JSON lines (or console) on ``stream`` and ``file``.

    Context bound with :func:`bound` (or ``structlog.contextvars.bound_contextvars``) appears on
    every line, so a handler binds run, actor, island and candidate ids for the message it handles.
    """
    global _configured
    handlers: list[logging.Handler] = [logging.StreamHandler(stream or sys.stderr)]
    if file:
        handlers.append(logging.FileHandler(file))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    renderer: Any = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    common: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    # Records of other libraries (faiss's loader, sentence-transformers, asyncio's "Task exception
    # was never retrieved") go through the same renderer: 11% of a run.log's lines were plain text.
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*common, structlog.stdlib.add_logger_name],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(level.upper())
    structlog.configure(
        processors=[
            *common,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )
    # Quiet libraries that log at info on every connection.
    logging.getLogger("nats").setLevel(logging.WARNING)
    _configured = True


def add_handler(handler: logging.Handler) -> None:
    """Send every log line also to ``handler``, rendered as the other lines are (after
    :func:`configure_logging`)."""
    root = logging.getLogger()
    if root.handlers:
        handler.setFormatter(root.handlers[0].formatter)
    root.addHandler(handler)


def remove_handler(handler: logging.Handler) -> None:
    """Stop sending log lines to ``handler``."""
    logging.getLogger().removeHandler(handler)


def get_logger(name: str) -> Any:
    """A structlog logger named for its module."""
    return structlog.get_logger(name)


@contextlib.contextmanager
def bound(**context: Any) -> Iterator[None]:
    """Bind ``context`` to every log line of the block, then restore what was bound before.

    What ``structlog.contextvars.bound_contextvars`` does, for the per-message hot paths: it
    resets the context variables by their tokens instead of copying the whole context first (a
    copy that grows with every context variable the process has)."""
    tokens = structlog.contextvars.bind_contextvars(**context)
    try:
        yield
    finally:
        structlog.contextvars.reset_contextvars(**tokens)
