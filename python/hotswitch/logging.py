"""Logging for hotswitch: one logger per subsystem under ``hotswitch``; one level for
Python and C++ from ``HOTSWITCH_LOG_LEVEL`` (trace, debug, info, warn, error, off), which
the C++ core reads once and Python takes from it."""

import logging

from hotswitch import _C

__all__ = ["get_logger", "set_log_level"]

_PY_LEVELS = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "off": logging.CRITICAL + 10,
}

_root = logging.getLogger("hotswitch")


def set_log_level(level: str) -> None:
    """Sets the level of hotswitch's Python and C++ logging; ``ValueError`` for a bad name."""
    if level not in _PY_LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(_PY_LEVELS)}")
    _C.set_log_level(level)
    _root.setLevel(_PY_LEVELS[level])


def get_logger(subsystem: str) -> logging.Logger:
    """The logger of one subsystem, e.g. ``get_logger("switch")``."""
    return _root.getChild(subsystem)


def _configure() -> None:
    if not _root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s] [%(name)s] [%(levelname)s] %(message)s"))
        _root.addHandler(handler)
        _root.propagate = False
    _root.setLevel(_PY_LEVELS[_C.log_level()])


_configure()
