"""Fixes for Beam's DaskRunner, installed by ``python -m pipeline build`` when it is used.

Checked with apache-beam 2.77 and 2.78 (``apache_beam/runners/dask/transform_evaluator.py``):

1. **Shared output buffers.** Every bundle of a ParDo appends to the *same* output
   list (the ``OneReceiver`` built once at graph construction, never cleared). A
   worker process that runs a second bundle of that ParDo, or evaluates it again for
   a side input, returns the earlier bundle's elements once more. We saw
   ``Count.Globally()`` of 120 elements read as 240 or 360 through a side input.
2. **Side inputs recomputed in every bundle.** A side input reaches a bundle as the
   side input's Dask bag, which the bundle computes (``list(bag)``) from inside its
   task: the side input's whole upstream graph runs again for each bundle that reads
   it, outside the graph the scheduler plans. Our build's ``num_docs`` hangs off the
   tokenized corpus, so every file was read and tokenized 6 times on a one-partition
   job, and about once more per partition of ``AssignBuckets`` with more partitions.
3. **Tagged outputs mixed into one bag.** The runner keeps one bag per transform, so
   every consumer of a multi-output ParDo (``.with_outputs``) reads all of its outputs,
   the tags dropped: the build's counts would reach its documents.

4. **Every GroupByKey shuffles in as many partitions as its input has.** Dask's task
   shuffle makes about ``n * sqrt(n)`` tasks for ``n`` partitions (``n * n`` up to 32),
   and a Flatten (every CoGroupByKey's) adds its inputs' partitions up. The scheduler and
   the workers keep every finished task's state until the job ends, so their memory grew
   with the corpus whatever the data (the task counts: docs/results.md, "The Dask graph's
   tasks").

``install()`` swaps the runner's ParDo translation for one whose bundles each get a
private copy of the invoker arguments and receivers (1), whose side inputs are
``dask.delayed`` dependencies of the bundle tasks, built on the side input bag's own
keys (2): each is computed once, in the same graph as everything else, and handed
whole to every bundle that needs it; and whose tagged outputs keep their tags, so that
each consumer reads the one output it names (3, :func:`_select`). Its GroupByKey first
merges its input into at most ``--dask_shuffle_partitions`` partitions (4,
:class:`DaskShuffleOptions`; unset: as many as the input has, as Beam's). After each
bundle the worker hands freed memory back to the system (:func:`trim_memory`), and Dask
sizes a Beam ``WindowedValue`` by its value too (:func:`register_sizeof`), so a worker
spills what it holds. The bundle function lives in this module, so Dask workers import
it by reference: each worker needs this package importable (installed, or on
PYTHONPATH).

Upstream: we found no Beam issue for (1) or (3) (searched apache/beam issues for the
DaskRunner's ParDo, duplicate outputs, ``apply_dofn_to_bundle``); none is filed.
The module-level ``apply_dofn_to_bundle`` with its shared ``OneReceiver`` came
with apache/beam PR #32941 ("Windowing Support for the Dask Runner", merged
2024-11-18), so the first release with it is 2.62.0 by release dates (2.61.0 was
branched before the merge) — inferred, not tested; 2.77 and 2.78 were run here (2.78
still builds one ``OneReceiver`` per ParDo at graph construction, and its
``to_dask_bag_visitor`` takes a new ``lazy_side_inputs``, which our wrapper passes on).

Which versions get the fixes (:func:`plan`): 2.62 to 2.78 (:data:`KNOWN_BAD`): applied.
Older: not applied: the replacement is written against the internals of 2.62 and
later (checked on 2.77 and 2.78), and without it (3) mixes the build's counts into its
data, so a Dask build needs 2.62 or later. Newer than 2.78, not yet
checked: applied all the same, with a log line saying so, because the fix is
harmless where the bug is gone (each bundle works on private copies of what it
was given, at the cost of one deep copy per bundle); drop it, and raise
``KNOWN_BAD``'s upper end, once a release is checked to be fixed.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import itertools
import logging
import re
import sys

from apache_beam.options.pipeline_options import PipelineOptions

logger = logging.getLogger(__name__)

# Beam releases known to share one output buffer between a ParDo's bundles (see above).
KNOWN_BAD = ((2, 62), (2, 78))


class DaskShuffleOptions(PipelineOptions):
    """``--dask_shuffle_partitions N``: each GroupByKey on the DaskRunner shuffles in at most
    N partitions, its input's merged first (fix 4 above; unset: as many as its input has).
    ``python -m pipeline curate`` sets it from its input's size (pipeline/beam/sizing.py)."""

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument(
            "--dask_shuffle_partitions",
            type=int,
            default=None,
            help="DaskRunner (with this project's fixes): the most partitions a GroupByKey "
            "shuffles in; its input's partitions are merged down to it (default: as many "
            "as its input has)",
        )


def shuffle_partitions(options: PipelineOptions) -> int | None:
    """``--dask_shuffle_partitions`` (None: unset).

    Raises:
        ValueError: it is not 1 or more.
    """
    limit = options.view_as(DaskShuffleOptions).dask_shuffle_partitions
    if limit is not None and limit < 1:
        raise ValueError(f"--dask_shuffle_partitions must be 1 or more, got {limit}")
    return limit


def _concat(parts) -> list:
    """A side input's partitions -> one list of its elements."""
    return list(itertools.chain.from_iterable(parts))


def _side_value(bag):
    """A Delayed of ``bag``'s elements in one list: one task over the bag's own keys, in a
    graph layer that refers to the bag's graph without copying it.

    (A bag.reduction Item would not do: Dask finalizes an Item argument into a renamed
    copy of its upstream graph, computed once more. Nor would ``dask.delayed(f)(parts)``:
    it culls a copy of the upstream graph into every side input, so the client's and the
    scheduler's memory grew with partitions x side inputs.)
    """
    from dask.base import tokenize
    from dask.delayed import Delayed
    from dask.highlevelgraph import HighLevelGraph

    name = f"side-input-{tokenize(bag.name)}"
    layer = {name: (_concat, [(bag.name, i) for i in range(bag.npartitions)])}
    return Delayed(name, HighLevelGraph.from_collections(name, layer, dependencies=[bag]))


def _run_bundle(items, invoker_args, invoker_kwargs, receivers, views, *side_values):
    """Like Beam's ``apply_dofn_to_bundle``, with receivers private to this bundle and
    side inputs built from values computed once (``views``: each side input's view
    class, options and window function; ``side_values``: its elements)."""
    from apache_beam.pvalue import TaggedOutput
    from apache_beam.runners.common import DoFnInvoker
    from apache_beam.runners.dask.transform_evaluator import get_windowed_value
    from apache_beam.transforms.sideinputs import SideInputMap

    # One deep copy keeps the links between the output handler and the receivers.
    invoker_args, invoker_kwargs, receivers = copy.deepcopy(
        (invoker_args, invoker_kwargs, receivers)
    )
    receivers.values.clear()
    if views:
        invoker_kwargs["side_inputs"] = [
            SideInputMap(view, options, [get_windowed_value(v, window_fn) for v in values])
            for (view, options, window_fn), values in zip(views, side_values, strict=True)
        ]
    invoker = DoFnInvoker.create_invoker(*invoker_args, **invoker_kwargs)
    invoker.invoke_setup()
    invoker.invoke_start_bundle()
    for item in items:
        invoker.invoke_process(item)
    invoker.invoke_finish_bundle()
    invoker.invoke_teardown()
    # Main outputs as values (as Beam's bundle gives them); tagged ones keep their tags.
    results = [
        TaggedOutput(v.tag, v.value.value) if isinstance(v, TaggedOutput) else v.value
        for v in receivers.values
    ]
    del invoker  # the DoFn and what it built, freed before the trim
    trim_memory()
    return results


def _is_main(item) -> bool:
    from apache_beam.pvalue import TaggedOutput

    return not isinstance(item, TaggedOutput)


def _has_tag(tag: str, item) -> bool:
    from apache_beam.pvalue import TaggedOutput

    return isinstance(item, TaggedOutput) and item.tag == tag


def _untag(item):
    return item.value


def _select(bag, tag: str | None):
    """The elements of one output of a multi-output ParDo's bag (:func:`_run_bundle`'s
    results): ``tag`` None is the main output."""
    if tag is None:
        return bag.filter(_is_main)
    return bag.filter(functools.partial(_has_tag, tag)).map(_untag)


def _with_outputs_apart(make_visitor):
    """Wrap the DaskRunner's ``to_dask_bag_visitor`` so that a transform reading an output
    of a multi-output ParDo, as main or side input, reads that output alone.

    The visitor finds a transform's input bags by producer; while it visits a transform,
    each multi-output producer's bag is replaced by the selection of the output the
    transform reads, then put back.

    Raises:
        NotImplementedError: one transform reads two outputs of the same ParDo (none of
            the project's does).
    """

    def to_dask_bag_visitor(*args, **kwargs):  # 2.78 added lazy_side_inputs: passed on
        visitor = make_visitor(*args, **kwargs)
        visit = visitor.visit_transform

        def visit_transform(node) -> None:
            bags, swapped = visitor.bags, {}
            for pcoll in [*node.inputs, *(side.pvalue for side in node.side_inputs)]:
                producer = getattr(pcoll, "producer", None)
                if producer not in bags or len(producer.outputs) < 2:
                    continue
                whole, tag = swapped.setdefault(producer, (bags[producer], pcoll.tag))
                if tag != pcoll.tag:
                    raise NotImplementedError(
                        f"{node.full_label} reads two outputs of {producer.full_label}: "
                        "the DaskRunner fix selects one output per reader"
                    )
                bags[producer] = _select(whole, tag)
            try:
                visit(node)
            finally:
                for producer, (whole, _) in swapped.items():
                    bags[producer] = whole

        visitor.visit_transform = visit_transform
        return visitor

    to_dask_bag_visitor._bert_pipeline_fix = True
    return to_dask_bag_visitor


def trim_memory() -> None:
    """Return the memory glibc's malloc holds freed to the system (``malloc_trim(0)``; a
    no-op elsewhere). A bundle frees millions of small objects; glibc keeps the pages
    (Dask's ``MALLOC_TRIM_THRESHOLD_`` only trims the top of the main heap), and Dask
    counts them as unmanaged memory it cannot spill (bench/pipeline_memory.py --runners
    dask shows a worker's peak with and without it)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None  # libc's malloc_trim once looked up; False where there is none


def register_sizeof() -> None:
    """Teach ``dask.sizeof`` a Beam ``WindowedValue``'s size, and a ``TaggedOutput``'s: its
    value's, not the 80 or 56 bytes of the wrapper that ``sys.getsizeof`` sees.

    The DaskRunner's bags hold windowed values between steps and through its GroupByKey
    shuffles; undercounted, a worker's shuffle data read as a small fraction of what it
    pickled to, so Dask neither spilled it nor held back new tasks, and the worker went
    past its memory limit and was restarted. The same held for tagged outputs: curate's
    removed documents, most of the text of bench/pipeline_memory.py's curate corpus, read
    as a few dozen bytes each, and its workers' memory was mostly what Dask calls
    "unmanaged" (docs/results.md, "Memory"). Runs when a process that has Dask loaded
    imports this module, as a worker does to run its first bundle (:func:`_run_bundle`),
    and in :func:`install`. No-op without Dask."""
    try:
        from apache_beam.pvalue import TaggedOutput
        from apache_beam.utils.windowed_value import WindowedValue
        from dask.sizeof import sizeof
    except ImportError:
        return

    @sizeof.register(WindowedValue)
    @sizeof.register(TaggedOutput)  # a multi-output ParDo's tagged elements, in its bag
    def _wrapper_size(value) -> int:
        return sys.getsizeof(value) + sizeof(value.value)


if "dask" in sys.modules:  # a Dask worker (a local build does not pay for importing Dask)
    register_sizeof()


def plan(beam_version: str) -> tuple[bool, str]:
    """Whether to install the fix on this Beam version, and why (the line to log).

    ``plan("2.77.0") -> (True, "...")``, ``plan("2.55.1") -> (False, "...")``; a newer,
    unchecked version is fixed too (see the module docstring). Raises nothing: a version
    string it cannot read is treated as newer.
    """
    parts = [int(p) for p in re.findall(r"\d+", beam_version)[:2]]
    version = tuple(parts) if len(parts) == 2 else (999, 0)
    (low, high) = KNOWN_BAD
    shown = f"{low[0]}.{low[1]}-{high[0]}.{high[1]}"
    if version < low:
        return False, (
            f"apache-beam {beam_version}: the DaskRunner fixes are written for {shown} and "
            "later, not installed; this DaskRunner mixes a ParDo's tagged outputs, which "
            "the build uses: build on Dask with apache-beam 2.62 or later"
        )
    if version <= high:
        return True, (
            f"apache-beam {beam_version}: installing the DaskRunner fixes (ParDo bundles "
            f"sharing one output buffer, known in {shown}; side inputs computed once)"
        )
    return True, (
        f"apache-beam {beam_version} is newer than {shown}, where the DaskRunner's ParDo bundles "
        "share one output buffer; installing the fix anyway (harmless if fixed upstream)"
    )


def install() -> None:
    """Replace the DaskRunner's ParDo translation where :func:`plan` says so (idempotent)."""
    import apache_beam
    from apache_beam import ParDo
    from apache_beam.runners.dask import transform_evaluator as te
    from apache_beam.runners.dask.dask_runner import DaskRunner
    from apache_beam.runners.dask.overrides import _GroupByKeyOnly

    register_sizeof()
    if getattr(te.TRANSLATIONS[ParDo], "_bert_pipeline_fix", False):
        return
    wanted, why = plan(apache_beam.__version__)
    if wanted and not all(hasattr(te, name) for name in ("OneReceiver", "get_windowed_value")):
        wanted, why = False, f"{why}; but this Beam's DaskRunner has other internals: not installed"
    logger.info(why)
    if not wanted:
        return

    class ParDoWithPrivateReceivers(te.ParDo):
        _bert_pipeline_fix = True

        def apply(self, input_bag, side_inputs=None):
            # Beam's ParDo.apply, with our bundle function and side inputs as dependencies.
            window_fn, receivers, invoker_args, invoker_kwargs = _invoker(te, self)
            views, values = [], []
            for side in side_inputs or []:
                windowed = side._iterable  # te.DaskBagWindowedIterator: the bag, not read
                views.append((side._view_class, side._view_options, windowed.window_fn))
                values.append(_side_value(windowed.bag))
            return input_bag.map(te.get_windowed_value, window_fn).map_partitions(
                _run_bundle, invoker_args, invoker_kwargs, receivers, views, *values
            )

    class GroupByKeyInFewerPartitions(te.GroupByKey):
        _bert_pipeline_fix = True

        def apply(self, input_bag, side_inputs=None):
            # Merging neighbouring partitions is one task per new partition, no shuffle.
            main_input = next(iter(self.applied.main_inputs.values()))
            limit = shuffle_partitions(main_input.pipeline.options)
            if limit is not None and input_bag.npartitions > limit:
                input_bag = input_bag.repartition(npartitions=limit)
            return super().apply(input_bag, side_inputs)

    te.TRANSLATIONS[ParDo] = ParDoWithPrivateReceivers
    te.TRANSLATIONS[_GroupByKeyOnly] = GroupByKeyInFewerPartitions
    # Only with this ParDo: its bundles' results carry the tags the selection reads.
    if not getattr(DaskRunner.to_dask_bag_visitor, "_bert_pipeline_fix", False):
        DaskRunner.to_dask_bag_visitor = staticmethod(
            _with_outputs_apart(DaskRunner.to_dask_bag_visitor)
        )


def _invoker(te, pardo) -> tuple:
    """What Beam's DaskRunner ParDo.apply gives its bundles, for the translation ``pardo``:
    (the main input's window function, one receiver for every output, the DoFn invoker's
    arguments and keyword arguments)."""
    from apache_beam import DoFn
    from apache_beam.runners.common import DoFnContext, DoFnSignature, _OutputHandler

    args, kwargs = pardo.transform.raw_side_inputs
    main_input = next(iter(pardo.applied.main_inputs.values()))
    window_fn = getattr(main_input, "windowing", None)
    window_fn = window_fn.windowfn if window_fn is not None else None
    receivers = te.OneReceiver()
    handler = _OutputHandler(
        window_fn=window_fn,
        main_receivers=receivers[None],
        tagged_receivers=receivers,
        per_element_output_counter=None,
        output_batch_converter=None,
        process_yields_batches=False,
        process_batch_yields_elements=False,
    )
    invoker_kwargs = dict(
        context=DoFnContext(pardo.transform.label, state=None),
        side_inputs=None,
        input_args=list(args),
        input_kwargs=kwargs,
        user_state_context=None,
        bundle_finalizer_param=DoFn.BundleFinalizerParam(),
    )
    return window_fn, receivers, [DoFnSignature(pardo.transform.fn), handler], invoker_kwargs


def uses_dask(beam_args: list[str]) -> bool:
    """Whether the Beam arguments select a DaskRunner."""
    for i, arg in enumerate(beam_args):
        value = arg.split("=", 1)[1] if arg.startswith("--runner=") else None
        if arg == "--runner" and i + 1 < len(beam_args):
            value = beam_args[i + 1]
        if value and "dask" in value.lower():
            return True
    return False
