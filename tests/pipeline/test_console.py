"""What reaches the console: our INFO lines, others' warnings that matter, nothing else."""

import logging

import pytest

from pipeline.console import ConsoleFilter, ConsoleFormatter, verbose_requested


def record(name, level, msg, *args):
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


@pytest.mark.parametrize(
    ("name", "level", "msg", "shown"),
    [
        ("pipeline", logging.INFO, "done in 3.0 s", True),
        ("pipeline.beam.build", logging.INFO, "1 input file(s)", True),
        ("pipelines", logging.INFO, "not ours, only the prefix", False),
        (
            "apache_beam.runners.worker.sdk_worker",
            logging.INFO,
            "Control channel established.",
            False,
        ),
        ("apache_beam.io", logging.WARNING, "Discarding unparseable args: ['--x']", True),
        ("root", logging.WARNING, "apitools not found, and bigquery client ...", False),
        ("DeepSpeed", logging.WARNING, "total_num_steps 5 is less than warmup_num_steps 9", True),
        ("pipeline", logging.INFO, "trainer config: {...}", False),  # file_only
        ("pipeline", logging.WARNING, "trainer config: {...}", True),  # file_only: INFO only
    ],
)
def test_console_filter(name, level, msg, shown):
    keep = ConsoleFilter(("pipeline",), file_only=("trainer config:",))
    assert keep.filter(record(name, level, msg)) is shown


def test_other_ranks_show_warnings_only_and_verbose_shows_everything():
    other_rank = ConsoleFilter(("trainer",), ours_level=logging.WARNING)
    assert not other_rank.filter(record("trainer.metrics", logging.INFO, "step 5/10"))
    assert other_rank.filter(record("trainer.metrics", logging.WARNING, "slow"))
    verbose = ConsoleFilter(("trainer",), others_level=logging.INFO, hide_noise=False)
    assert verbose.filter(record("root", logging.WARNING, "apitools not found"))
    assert verbose.filter(record("DeepSpeed", logging.INFO, "Added key: ..."))


def test_console_format_is_short_and_drops_tracebacks():
    try:
        raise ValueError("inner")
    except ValueError:
        import sys

        failed = logging.LogRecord(
            "pipeline", logging.ERROR, __file__, 1, "build failed: %s", ("inner",), sys.exc_info()
        )
    info = record("pipeline", logging.INFO, "done in %.1f s", 3.0)
    fmt = ConsoleFormatter("[rank 1] ")
    assert fmt.format(info).endswith(" [rank 1] done in 3.0 s")
    assert fmt.format(failed).endswith(" [rank 1] ERROR pipeline: build failed: inner")
    assert "Traceback" in logging.Formatter().format(failed)  # the log file still gets it


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        (False, None, False),
        (True, None, True),
        (False, "1", True),
        (False, "0", False),
        (False, "", False),
    ],
)
def test_verbose_from_flag_or_environment(monkeypatch, flag, env, expected):
    monkeypatch.delenv("BERT_VERBOSE", raising=False)
    if env is not None:
        monkeypatch.setenv("BERT_VERBOSE", env)
    assert verbose_requested(flag) is expected
