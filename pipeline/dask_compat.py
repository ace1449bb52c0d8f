"""A fix for Beam's DaskRunner, installed by ``python -m pipeline build`` when it is used.

Beam's DaskRunner (checked with apache-beam 2.77) runs every bundle of a ParDo
with the *same* output buffer: ``apply_dofn_to_bundle`` appends to the list held
by the ``OneReceiver`` built once at graph construction and never clears it. A
worker process that runs a second bundle of that ParDo, or evaluates it again
for a side input, returns the earlier bundle's elements once more. We saw
``Count.Globally()`` of 120 elements read as 240 or 360 through a side input.

``install()`` swaps the runner's ParDo translation for one whose bundles each get
a private copy of the invoker arguments and receivers, so nothing is shared
between bundles or threads. The translation table is read on the driver when the
graph is built, and the bundle function lives in this module, so Dask workers
import the fixed function by reference.
"""

from __future__ import annotations

import copy
import logging

logger = logging.getLogger(__name__)


def _run_bundle(items, invoker_args, invoker_kwargs, receivers):
    """Like Beam's ``apply_dofn_to_bundle``, with receivers private to this bundle."""
    from apache_beam.runners.common import DoFnInvoker

    # One deep copy keeps the links between the output handler and the receivers.
    invoker_args, invoker_kwargs, receivers = copy.deepcopy(
        (invoker_args, invoker_kwargs, receivers)
    )
    receivers.values.clear()
    invoker = DoFnInvoker.create_invoker(*invoker_args, **invoker_kwargs)
    invoker.invoke_setup()
    invoker.invoke_start_bundle()
    for item in items:
        invoker.invoke_process(item)
    invoker.invoke_finish_bundle()
    invoker.invoke_teardown()
    return [v.value for v in receivers.values]


def install() -> None:
    """Replace the DaskRunner's ParDo translation (idempotent)."""
    from apache_beam import ParDo
    from apache_beam.runners.dask import transform_evaluator as te

    if getattr(te.TRANSLATIONS[ParDo], "_bert_pipeline_fix", False):
        return

    class ParDoWithPrivateReceivers(te.ParDo):
        _bert_pipeline_fix = True

        def apply(self, input_bag, side_inputs=None):
            # Beam's ParDo.apply builds the bag with its own bundle function;
            # build it the same way, then swap the function for ours.
            original = te.apply_dofn_to_bundle
            te.apply_dofn_to_bundle = _run_bundle
            try:
                return super().apply(input_bag, side_inputs)
            finally:
                te.apply_dofn_to_bundle = original

    te.TRANSLATIONS[ParDo] = ParDoWithPrivateReceivers
    logger.info("installed the DaskRunner fix for shared ParDo output buffers")


def uses_dask(beam_args: list[str]) -> bool:
    """Whether the Beam arguments select a DaskRunner."""
    for i, arg in enumerate(beam_args):
        value = arg.split("=", 1)[1] if arg.startswith("--runner=") else None
        if arg == "--runner" and i + 1 < len(beam_args):
            value = beam_args[i + 1]
        if value and "dask" in value.lower():
            return True
    return False
