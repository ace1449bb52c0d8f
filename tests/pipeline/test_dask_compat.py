"""pipeline/beam/dask_compat.py: which Beam versions get the DaskRunner fix, and that it says so."""

import json
import logging

import apache_beam as beam
import pytest

from pipeline.beam import dask_compat


@pytest.mark.parametrize(
    ("version", "wanted", "says"),
    [
        ("2.55.1", False, "not installed"),
        ("2.61.0", False, "not installed"),
        ("2.62.0", True, "installing the DaskRunner fix"),
        ("2.77.0", True, "installing the DaskRunner fix"),
        ("2.78.0", True, "installing the DaskRunner fix"),
        ("2.79.0rc1", True, "newer than 2.62-2.78"),
        ("3.0.0", True, "installing the fix anyway"),
        ("unknown", True, "installing the fix anyway"),
    ],
)
def test_plan_by_version(version, wanted, says):
    got, why = dask_compat.plan(version)
    assert got is wanted
    assert says in why and version in why


def test_the_visitor_wrapper_passes_every_argument_on():
    # Beam 2.78's to_dask_bag_visitor(bag_kwargs, lazy_side_inputs) took a second argument
    # that a wrapper with the 2.77 signature refused: every Dask build failed.
    seen = []

    class Visitor:
        def __init__(self):
            self.bags = {}

        def visit_transform(self, node):
            pass

    def make_visitor(*args, **kwargs):
        seen.append((args, kwargs))
        return Visitor()

    wrapped = dask_compat._with_outputs_apart(make_visitor)
    wrapped({"npartitions": 2}, True)
    wrapped(bag_kwargs=None, lazy_side_inputs=False)
    assert seen == [
        (({"npartitions": 2}, True), {}),
        ((), {"bag_kwargs": None, "lazy_side_inputs": False}),
    ]


def test_install_logs_and_replaces_the_pardo_translation(caplog):
    pytest.importorskip("dask.bag", reason="the [dask] extra")
    import apache_beam
    from apache_beam import ParDo
    from apache_beam.runners.dask import transform_evaluator as te
    from apache_beam.runners.dask.dask_runner import DaskRunner
    from apache_beam.runners.dask.overrides import _GroupByKeyOnly

    originals = dict(te.TRANSLATIONS)
    visitor = DaskRunner.__dict__["to_dask_bag_visitor"]
    try:
        with caplog.at_level(logging.INFO, logger="pipeline.beam.dask_compat"):
            dask_compat.install()
            dask_compat.install()  # idempotent: once is enough
        wanted, why = dask_compat.plan(apache_beam.__version__)
        ours = [r.getMessage() for r in caplog.records if r.name == "pipeline.beam.dask_compat"]
        assert ours == [why]
        assert getattr(te.TRANSLATIONS[ParDo], "_bert_pipeline_fix", False) is wanted
        assert getattr(te.TRANSLATIONS[_GroupByKeyOnly], "_bert_pipeline_fix", False) is wanted
    finally:
        te.TRANSLATIONS.update(originals)
        DaskRunner.to_dask_bag_visitor = visitor


def dask_bags(pipeline) -> dict:
    """The DaskRunner's bag of each transform of ``pipeline``, by label, uncomputed."""
    from apache_beam.runners.dask.dask_runner import DaskOptions, DaskRunner
    from apache_beam.runners.dask.overrides import dask_overrides

    options = pipeline.options.view_as(DaskOptions)
    bag_kwargs = DaskOptions._extract_bag_kwargs(
        options.get_all_options(drop_default=True, current_only=True)
    )
    pipeline.replace_all(dask_overrides())
    visitor = DaskRunner.to_dask_bag_visitor(bag_kwargs)
    pipeline.visit(visitor)
    return {node.full_label: bag for node, bag in visitor.bags.items()}


@pytest.mark.parametrize(("limit", "expected"), [(None, 16), (3, 3), (40, 16)])
def test_a_group_by_key_shuffles_in_at_most_dask_shuffle_partitions(limit, expected):
    """Dask's task shuffle makes ~n * n tasks for n partitions; with the option set, the
    GroupByKey's input is merged down to it first, and groups the same."""
    pytest.importorskip("dask.bag", reason="the [dask] extra")
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.dask import transform_evaluator as te
    from apache_beam.runners.dask.dask_runner import DaskRunner

    originals = dict(te.TRANSLATIONS)
    visitor = DaskRunner.__dict__["to_dask_bag_visitor"]
    args = ["--dask_npartitions=8"] + ([f"--dask_shuffle_partitions={limit}"] if limit else [])
    try:
        dask_compat.install()
        p = beam.Pipeline(options=PipelineOptions(args))
        words = [("a", 1), ("b", 2), ("a", 3), ("c", 4)] * 10
        one = p | "One" >> beam.Create(words)
        two = p | "Two" >> beam.Create([(k + k, v) for k, v in words])
        (
            (one, two)
            | "Both" >> beam.Flatten()  # a CoGroupByKey's: 8 + 8 partitions
            | "Group" >> beam.GroupByKey()
            | "Sum" >> beam.MapTuple(lambda key, values: (key, sum(values)))
        )
        bags = dask_bags(p)
        assert bags["Both"].npartitions == 16
        assert bags["Group/GroupByKey"].npartitions == expected
        got = dict(bags["Sum"].compute(scheduler="sync"))
        assert got == {"a": 40, "b": 20, "c": 40, "aa": 40, "bb": 20, "cc": 40}
    finally:
        te.TRANSLATIONS.update(originals)
        DaskRunner.to_dask_bag_visitor = visitor


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


def test_dask_sizes_a_tagged_output_by_its_value():
    """A multi-output ParDo's bag holds TaggedOutputs (dask_compat keeps their tags): 56
    bytes each to ``sys.getsizeof``, so curate's removed texts were never spilled."""
    from apache_beam.pvalue import TaggedOutput

    sizeof = pytest.importorskip("dask.sizeof").sizeof
    from pipeline.beam.dask_compat import register_sizeof

    register_sizeof()
    removed = TaggedOutput("removed", ("c4.min_sentences", ("id", "x" * 1_000_000)))
    assert 1_000_000 <= sizeof(removed) < 1_002_000


class Numbers(beam.DoFn):
    """Each number, and tagged: a count per number and the odd numbers."""

    def process(self, number: int):
        yield number
        yield beam.pvalue.TaggedOutput("counts", ("numbers", 1))
        if number % 2:
            yield beam.pvalue.TaggedOutput("odd", number)


def write_result(total: int, counts: dict, odd: list, path: str) -> None:
    with open(path, "w") as f:
        json.dump({"total": total, "counts": counts, "odd": sorted(odd)}, f)


@pytest.mark.slow
def test_each_reader_of_a_multi_output_pardo_gets_its_own_output(tmp_path):
    """The DaskRunner keeps one bag per transform, so without the fix every reader of a
    ParDo's tagged or main output read all of them (the sum below fails on the tuples);
    the build sends its counts as tagged outputs. One final step reads all three, as the
    runner computes only the last transform's bag."""
    pytest.importorskip("distributed", reason="the [dask] extra")
    from apache_beam.options.pipeline_options import PipelineOptions

    dask_compat.install()
    path = str(tmp_path / "result.json")
    options = PipelineOptions(["--runner=apache_beam.runners.dask.dask_runner.DaskRunner"])
    with beam.Pipeline(options=options) as p:
        made = (
            p
            | beam.Create(range(6))
            | beam.ParDo(Numbers()).with_outputs("counts", "odd", main="numbers")
        )
        counts = made.counts | beam.CombinePerKey(sum)
        (
            made.numbers
            | "Total" >> beam.CombineGlobally(sum)
            | beam.Map(
                write_result,
                counts=beam.pvalue.AsDict(counts),
                odd=beam.pvalue.AsList(made.odd),
                path=path,
            )
        )
    with open(path) as f:
        assert json.load(f) == {"total": 15, "counts": {"numbers": 6}, "odd": [1, 3, 5]}
