"""A fix for Beam's DaskRunner, installed by ``python -m pipeline build`` when it is used.

Beam's DaskRunner (checked with apache-beam 2.77) runs every bundle of a ParDo
with the *same* output buffer: ``apply_dofn_to_bundle`` appends to the list held
by the ``OneReceiver`` built once at graph construction and never clears it. A
worker process that runs a second bundle of that ParDo, or evaluates it again
for a side input, returns the earlier bundle's elements once more. We saw
``Count.Globally()`` of 120 elements read as 240 or 360 through a side input.

Upstream: we found no Beam issue for this (searched apache/beam issues for the
DaskRunner's ParDo, duplicate outputs, ``apply_dofn_to_bundle``); none is filed.
The module-level ``apply_dofn_to_bundle`` with its shared ``OneReceiver`` came
with apache/beam PR #32941 ("Windowing Support for the Dask Runner", merged
2024-11-18), so the first release with it is 2.62.0 by release dates (2.61.0 was
branched before the merge) — inferred, not tested; only 2.77 was run here.

Which versions get it (:func:`plan`): 2.62 to 2.77 (:data:`KNOWN_BAD`): applied.
Older: not applied — their ParDo has no such bundle function to replace (the fix
would fail on them), and the bug as described needs it. Newer than 2.77, not yet
checked: applied all the same, with a log line saying so, because the fix is
harmless where the bug is gone (each bundle works on private copies of what it
was given, at the cost of one deep copy per bundle); drop it, and raise
``KNOWN_BAD``'s upper end, once a release is checked to be fixed.

``install()`` swaps the runner's ParDo translation for one whose bundles each get
a private copy of the invoker arguments and receivers, so nothing is shared
between bundles or threads. The translation table is read on the driver when the
graph is built, and the bundle function lives in this module, so Dask workers
import the fixed function by reference.
"""

from __future__ import annotations

import copy
import logging
import re

logger = logging.getLogger(__name__)

# Beam releases known to share one output buffer between a ParDo's bundles (see above).
KNOWN_BAD = ((2, 62), (2, 77))


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
            f"apache-beam {beam_version}: no DaskRunner fix needed (the shared ParDo output "
            f"buffer it fixes is in {shown})"
        )
    if version <= high:
        return True, (
            f"apache-beam {beam_version}: installing the DaskRunner fix for ParDo bundles "
            f"sharing one output buffer (known in {shown})"
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

    if getattr(te.TRANSLATIONS[ParDo], "_bert_pipeline_fix", False):
        return
    wanted, why = plan(apache_beam.__version__)
    if wanted and not hasattr(te, "apply_dofn_to_bundle"):
        wanted, why = False, f"{why}; but this Beam has no apply_dofn_to_bundle: not installed"
    logger.info(why)
    if not wanted:
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


def uses_dask(beam_args: list[str]) -> bool:
    """Whether the Beam arguments select a DaskRunner."""
    for i, arg in enumerate(beam_args):
        value = arg.split("=", 1)[1] if arg.startswith("--runner=") else None
        if arg == "--runner" and i + 1 < len(beam_args):
            value = beam_args[i + 1]
        if value and "dask" in value.lower():
            return True
    return False
