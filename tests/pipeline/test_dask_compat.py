"""pipeline/beam/dask_compat.py: which Beam versions get the DaskRunner fix, and that it says so."""

import logging

import pytest

from pipeline.beam import dask_compat


@pytest.mark.parametrize(
    ("version", "wanted", "says"),
    [
        ("2.55.1", False, "no DaskRunner fix needed"),
        ("2.61.0", False, "no DaskRunner fix needed"),
        ("2.62.0", True, "installing the DaskRunner fix"),
        ("2.77.0", True, "installing the DaskRunner fix"),
        ("2.78.0rc1", True, "newer than 2.62-2.77"),
        ("3.0.0", True, "installing the fix anyway"),
        ("unknown", True, "installing the fix anyway"),
    ],
)
def test_plan_by_version(version, wanted, says):
    got, why = dask_compat.plan(version)
    assert got is wanted
    assert says in why and version in why


def test_install_logs_and_replaces_the_pardo_translation(caplog):
    pytest.importorskip("dask.bag", reason="the [dask] extra")
    import apache_beam
    from apache_beam import ParDo
    from apache_beam.runners.dask import transform_evaluator as te

    original = te.TRANSLATIONS[ParDo]
    try:
        with caplog.at_level(logging.INFO, logger="pipeline.beam.dask_compat"):
            dask_compat.install()
            dask_compat.install()  # idempotent: once is enough
        wanted, why = dask_compat.plan(apache_beam.__version__)
        ours = [r.getMessage() for r in caplog.records if r.name == "pipeline.beam.dask_compat"]
        assert ours == [why]
        assert getattr(te.TRANSLATIONS[ParDo], "_bert_pipeline_fix", False) is wanted
    finally:
        te.TRANSLATIONS[ParDo] = original


def test_dask_sizes_a_windowed_value_by_its_value():
    """The DaskRunner's bags hold Beam WindowedValues; Dask saw 80 bytes for each, so a
    worker's shuffle data read as 5.8 MB where it pickled to 318 MB and was never spilled."""
    import numpy as np
    from apache_beam.transforms.window import GlobalWindows

    sizeof = pytest.importorskip("dask.sizeof").sizeof
    from pipeline.beam.dask_compat import register_sizeof

    register_sizeof()
    value = GlobalWindows.windowed_value((3, np.zeros(1_000_000, np.uint8)))
    assert 1_000_000 <= sizeof(value) < 1_001_000
    assert sizeof([value] * 20) >= 20_000_000  # a partition of them
