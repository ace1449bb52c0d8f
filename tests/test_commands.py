"""Every command line of the project: either spelling of a flag, and one-line did-you-mean.

The pipeline declares Google's underscores (``--vocab_size``), the trainer and finetune
hyphens (``--max-steps``); each takes the other spelling too (pipeline/options.py).
"""

from __future__ import annotations

import importlib

import pytest

from tests.helpers import make_corpus

# (module whose main(argv) runs the command, argv with a misspelt flag, what it suggests)
TYPOS = [
    (
        "pipeline.cli.main",
        ["build", "--input", "x", "--output", "o", "--vocab-sise", "9"],
        "unknown option --vocab-sise (did you mean --vocab_size?)",
    ),
    (
        "pipeline.cli.main",
        ["export", "s", "--to", "tfrecord", "--output", "o", "--log-fil", "l"],
        "unknown option --log-fil (did you mean --log_file?)",
    ),
    (
        "pipeline.cli.main",
        ["stats", "s", "--plot-dri", "p"],
        "unknown option --plot-dri (did you mean --plot_dir?)",
    ),
    (
        "pipeline.cli.main",
        ["inspect", "s", "--wrods"],
        "unknown option --wrods (did you mean --words?)",
    ),
    ("pipeline.cli.main", ["validate", "s", "--shrad", "1"], "unknown option --shrad"),
    (
        "pipeline.cli.main",
        ["corpus", "--output", "o", "--max_bm", "1"],
        "unknown option --max_bm (did you mean --max_mb?)",
    ),
    ("trainer.run", ["--mdoel", "tiny"], "unknown option --mdoel (did you mean --model?)"),
    (
        "trainer.export",
        ["c", "h", "--vocba", "v"],
        "unknown option --vocba (did you mean --vocab?)",
    ),
    ("report.summary", ["r", "--json"], "unknown option --json"),
    (
        "report.plot",
        ["r", "--outptu-dir", "p"],
        "unknown option --outptu-dir (did you mean --output-dir?)",
    ),
    (
        "trainer.fillmask",
        ["e", "s", "--top_kk", "3"],
        "unknown option --top_kk (did you mean --top-k?)",
    ),
    ("finetune.__main__", ["--taks", "qa"], "unknown option --taks (did you mean --task?)"),
    (
        "model.export_onnx",
        ["d", "o.onnx", "--quantise"],
        "unknown option --quantise (did you mean --quantize?)",
    ),
]


def exit_code(module: str, argv: list[str]) -> int:
    """``main(argv)``'s exit code, whether it returns it or argparse raises it."""
    try:
        return importlib.import_module(module).main(argv)
    except SystemExit as stop:
        return stop.code


@pytest.mark.parametrize("module, argv, says", TYPOS, ids=[f"{t[0]} {t[1][0]}" for t in TYPOS])
def test_a_misspelt_flag_is_one_line_naming_the_closest(module, argv, says, capfd):
    capfd.readouterr()
    assert exit_code(module, argv) == 2
    err = capfd.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], err
    assert says + " (" not in lines[0]  # no suggestion where none is close
    assert "usage:" not in err and "Traceback" not in err


def test_the_pipelines_flags_with_hyphens(tmp_path):
    from pipeline.beam.config import parse_build_args
    from pipeline.beam.export import parse_export_args

    config, beam_args = parse_build_args(
        [
            "--input",
            "x",
            "--output",
            "o",
            "--vocab-size",
            "100",
            "--max-seq-length=64",
            "--runner=X",
        ]
    )
    assert (config.vocab_size, config.max_seq_length, beam_args) == (100, 64, ["--runner=X"])
    config, beam_args = parse_export_args(
        [
            "s",
            "--to",
            "tfrecord",
            "--output",
            "o",
            "--max-predictions-per-seq",
            "9",
            "--log-file",
            "l",
            "--tfrecord_names",
            "v2",
        ]
    )
    assert (config.max_predictions_per_seq, config.tfrecord_names, beam_args) == (9, "v2", [])


def test_beams_options_with_hyphens_reach_beam():
    """Beam drops ``--direct-num-workers=2`` silently (it reads it as known, then discards
    it as unparseable); it is handed on in Beam's spelling, its own hyphenated one kept."""
    from pipeline.beam.runner import check_beam_options

    given = [
        "--direct-num-workers=2",
        "--direct_running_mode",
        "multi_processing",
        "--job-server-timeout=5",
        "--job_endpoint",
        "localhost:1",
    ]
    assert check_beam_options(given) == [
        "--direct_num_workers=2",
        "--direct_running_mode",
        "multi_processing",
        "--job-server-timeout=5",
        "--job_endpoint",
        "localhost:1",
    ]


def test_the_trainers_and_finetunes_flags_with_underscores(tmp_path):
    from finetune.config import parse_config
    from trainer.config import parse_args

    config = parse_args(
        [
            "--ds_config",
            "d.json",
            "--data",
            "s",
            "--output_dir",
            "o",
            "--model",
            "tiny",
            "--max_steps=7",
            "--local_rank=3",
        ]
    )
    assert (config.ds_config, config.output_dir, config.max_steps) == ("d.json", "o", 7)
    both = parse_args(
        [
            "--ds-config",
            "d",
            "--data",
            "s",
            "--output-dir",
            "o",
            "--model",
            "tiny",
            "--local-rank",
            "0",
        ]
    )
    assert both.ds_config == "d"
    config = parse_config(
        [
            "--task",
            "classification",
            "--init",
            "i",
            "--train",
            "t",
            "--eval",
            "e",
            "--output_dir",
            "o",
            "--batch_size",
            "4",
        ]
    )
    assert (config.output_dir, config.batch_size) == ("o", 4)


def test_the_other_spelling_reaches_the_command(tmp_path, capfd):
    """Past the flags: a bad value is refused naming the flag, a missing input exits 1."""
    missing = str(tmp_path / "missing")
    capfd.readouterr()
    assert exit_code("pipeline.cli.main", ["stats", missing, "--plot-dir", "p"]) == 1
    for module, argv, says in [
        ("pipeline.cli.main", ["inspect", missing, "--num-rows", "x"], "--num_rows: invalid int"),
        ("trainer.fillmask", [missing, missing, "--top_k", "x"], "--top-k: invalid int"),
        (
            "pipeline.cli.main",
            ["corpus", "--output", missing, "--max-mb", "x"],
            "--max_mb: invalid float",
        ),
    ]:
        assert exit_code(module, argv) == 2
        err = capfd.readouterr().err
        assert says in err, err


def test_help_still_works(capsys):
    for module, argv in [
        ("trainer.run", ["--help"]),
        ("pipeline.cli.main", ["build", "-h"]),
        ("report.summary", ["--help"]),
    ]:
        assert exit_code(module, argv) == 0
        assert "usage:" in capsys.readouterr().out


def test_a_build_with_hyphenated_flags(tmp_path):
    from pipeline.cli.main import main
    from pipeline.shards.shard_format import read_manifest

    corpus = make_corpus(tmp_path / "corpus", n_docs=20, n_files=1)
    out = tmp_path / "out"
    assert (
        main(
            [
                "build",
                "--input",
                corpus,
                "--output",
                str(out),
                "--vocab-size",
                "120",
                "--dupe-factor",
                "1",
                "--max-seq-length",
                "32",
                "--num-shards",
                "1",
                "--direct-num-workers=1",
            ]
        )
        == 0
    )
    params = read_manifest(str(out))["params"]
    assert (params["vocab_size"], params["dupe_factor"], params["max_seq_length"]) == (120, 1, 32)
