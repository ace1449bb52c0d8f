"""The console of our command-line tools: our own lines on the terminal, everything in a log file.

``python -m pipeline build`` and ``trainer/run.py`` log through two handlers on the root
logger: a log file that takes every record at INFO and above (Beam's, DeepSpeed's, ours), and
the console, which takes our loggers' INFO lines and the warnings that call for action.
``--verbose`` or ``BERT_VERBOSE=1`` puts every record on the console again.

Beam's DirectRunner in ``multi_processing`` mode starts its workers as subprocesses that
inherit file descriptor 2 and log there, past Python's logging; :func:`stderr_to` sends that
descriptor to the log file while the pipeline runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import TextIO

VERBOSE_ENV = "BERT_VERBOSE"
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Warnings printed on every run that need no action (matched against the message).
KNOWN_NOISE = (
    "apitools not found",  # Beam without the gcp extra; we read local files
    "bigquery_storage_v1",  # the same, for BigQuery
    "No semi_persistent_directory found",  # every Beam SDK worker at start-up
)


def verbose_requested(flag: bool = False) -> bool:
    """True when ``--verbose`` was given or ``BERT_VERBOSE`` is set to anything but 0."""
    return flag or os.environ.get(VERBOSE_ENV, "").strip() not in ("", "0")


class ConsoleFilter(logging.Filter):
    """Which records reach the console (a filter, not a handler level, so that tqdm's
    ``logging_redirect_tqdm`` carries it over).

    Args:
        ours: logger names (with their children) shown from ``ours_level`` on.
        ours_level: INFO on the main process, WARNING on the other ranks.
        others_level: the least level shown of every other logger.
        file_only: format strings of our INFO records kept off the console (long dumps).
        hide_noise: drop the warnings of :data:`KNOWN_NOISE`.
    """

    def __init__(
        self,
        ours: tuple[str, ...],
        *,
        ours_level: int = logging.INFO,
        others_level: int = logging.WARNING,
        file_only: tuple[str, ...] = (),
        hide_noise: bool = True,
    ):
        super().__init__()
        self.ours, self.file_only, self.hide_noise = ours, file_only, hide_noise
        self.ours_level, self.others_level = ours_level, others_level

    def filter(self, record: logging.LogRecord) -> bool:
        if any(record.name == n or record.name.startswith(n + ".") for n in self.ours):
            if record.levelno <= logging.INFO and str(record.msg).startswith(self.file_only):
                return False
            return record.levelno >= self.ours_level
        if record.levelno < self.others_level:
            return False
        message = record.getMessage()
        return not (self.hide_noise and any(noise in message for noise in KNOWN_NOISE))


class ConsoleFormatter(logging.Formatter):
    """``12:01:02 message``; warnings and errors name their level and logger; no tracebacks
    (they go to the log file, whose path the error line gives)."""

    def __init__(self, prefix: str = ""):
        super().__init__("%(asctime)s " + prefix + "%(message)s", datefmt="%H:%M:%S")
        self._loud = logging.Formatter(
            "%(asctime)s " + prefix + "%(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
        )

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None
        try:
            if record.levelno >= logging.WARNING:
                return self._loud.format(record)
            return super().format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


def install(
    ours: tuple[str, ...],
    *,
    verbose: bool,
    log_path: str | None = None,
    main: bool = True,
    tag: str = "",
    file_only: tuple[str, ...] = (),
    stream: TextIO | None = None,
) -> list[logging.Handler]:
    """Put the root logger at INFO with a console handler and, given ``log_path``, a log file.

    Args:
        ours: our loggers, e.g. ``("pipeline",)``.
        verbose: every record on the console (INFO on the main process, WARNING elsewhere).
        log_path: the file that takes every record at INFO and above (appended to).
        main: False on the other ranks of a distributed job (warnings only).
        tag: put before each line, e.g. ``"[rank 1] "``.
        file_only: see :class:`ConsoleFilter`.
        stream: the console (default: ``sys.stderr``).

    Returns the handlers, for :func:`uninstall`.
    """
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    level = logging.INFO if main else logging.WARNING
    console = logging.StreamHandler(sys.stderr if stream is None else stream)
    if verbose:
        console.addFilter(
            ConsoleFilter(ours, ours_level=level, others_level=level, hide_noise=False)
        )
        console.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s")
        )
    else:
        console.addFilter(ConsoleFilter(ours, ours_level=level, file_only=file_only))
        console.setFormatter(ConsoleFormatter(tag))
    root.addHandler(console)
    try:
        return [console] + ([add_log_file(log_path, tag)] if log_path else [])
    except OSError:  # the log file cannot be made: leave the root logger as it was
        root.removeHandler(console)
        raise


class LogFileError(OSError):
    """The log file cannot be written (a full disk, a lost mount): the run stops on it."""


class _LogFile(logging.FileHandler):
    """A FileHandler that, when the file cannot be written, leaves the root logger and raises
    :class:`LogFileError` from the logging call once, instead of printing logging's
    "--- Logging error ---" traceback to the console for every record that follows."""

    def handleError(self, record: logging.LogRecord) -> None:
        err = sys.exc_info()[1]
        if not isinstance(err, OSError):
            super().handleError(record)
            return
        logging.getLogger().removeHandler(self)
        with contextlib.suppress(OSError):  # closing flushes what could not be written
            self.close()
        raise LogFileError(
            err.errno, f"cannot write the log file {self.baseFilename}: {err.strerror or err}"
        ) from err


def add_log_file(path: str, tag: str = "") -> logging.Handler:
    """Append every record at INFO and above to ``path``; returns the handler. A record that
    cannot be written raises :class:`LogFileError` (once: the handler is removed)."""
    file = _LogFile(path, encoding="utf-8")
    file.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s"))
    logging.getLogger().addHandler(file)
    return file


def uninstall(handlers: list[logging.Handler]) -> None:
    """Remove and close what :func:`install` added (the console stream stays open)."""
    for handler in handlers:
        logging.getLogger().removeHandler(handler)
        handler.close()


def console_stream() -> TextIO:
    """A stream on a duplicate of descriptor 2: it stays on the terminal when
    :func:`stderr_to` moves descriptor 2 to the log file."""
    sys.stderr.flush()
    return os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="backslashreplace")


@contextlib.contextmanager
def stderr_to(path: str) -> Iterator[None]:
    """Descriptor 2 of this process, and of every subprocess started meanwhile, appends to
    ``path``; restored on exit."""
    sys.stderr.flush()
    fd = 2
    saved = os.dup(fd)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log, fd)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, fd)
        os.close(saved)
        os.close(log)
