"""Our Beam steps' type hints pass the checks Beam runs on them when a pipeline is built.

Why the hints matter: Beam reads a ``DoFn.process``'s return annotation as the step's output
type, an *iterable of elements* (it strips one level of iteration, the "flat" of a ParDo),
and a ``PTransform.expand``'s annotations as PCollection types. Beam 2.78 began to check
them while the graph is built: a ``process(...) -> None`` on a DoFn that emits from
``finish_bundle`` failed every vocab-learning build with "Return value not iterable: ...
<class 'NoneType'> is not iterable". Such a step has no return annotation instead.

These tests run Beam's own check (``default_type_hints``) on every DoFn, CombineFn and
PTransform that pipeline/ defines, so that a hint the installed Beam refuses fails here,
named, rather than in a user's build; and they refuse ``-> None`` on ``process`` whatever
the installed Beam, since no Beam can read it as a type of elements.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import apache_beam as beam
import pytest

import pipeline


def _pipeline_classes(base: type) -> list[type]:
    """Every subclass of ``base`` defined in pipeline/ (all its modules imported)."""
    for module in pkgutil.walk_packages(pipeline.__path__, "pipeline."):
        importlib.import_module(module.name)
    found, todo = {}, [base]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("pipeline."):
                found[f"{sub.__module__}.{sub.__qualname__}"] = sub
    return [found[name] for name in sorted(found)]


def _bare(cls: type, base: type):
    """An instance of ``cls`` without its constructor's arguments: the hints are the class's."""
    instance = cls.__new__(cls)
    base.__init__(instance)
    return instance


DOFNS = _pipeline_classes(beam.DoFn)
TRANSFORMS = _pipeline_classes(beam.PTransform)
COMBINE_FNS = _pipeline_classes(beam.CombineFn)


def test_the_steps_are_found():
    # The discovery itself must not come back empty (or every test below passes vacuously).
    names = {cls.__name__ for cls in DOFNS + TRANSFORMS + COMBINE_FNS}
    assert {"CountInBundle", "SpoolTexts", "WriteShard", "CountWords", "JoinCounts"} <= names


@pytest.mark.parametrize("cls", DOFNS, ids=lambda cls: cls.__name__)
def test_dofn_hints_pass_beams_check(cls):
    _bare(cls, beam.DoFn).default_type_hints()  # raises "Return value not iterable" if not


@pytest.mark.parametrize("cls", DOFNS, ids=lambda cls: cls.__name__)
def test_process_is_never_annotated_none(cls):
    returns = inspect.signature(cls.process).return_annotation
    assert returns not in (None, "None", type(None)), (
        f"{cls.__module__}.{cls.__qualname__}.process is annotated '-> None': Beam reads "
        "it as the step's output type (an iterable of elements); leave it unannotated"
    )


@pytest.mark.parametrize("cls", TRANSFORMS, ids=lambda cls: cls.__name__)
def test_transform_hints_pass_beams_check(cls):
    _bare(cls, beam.PTransform).default_type_hints()


@pytest.mark.parametrize("cls", COMBINE_FNS, ids=lambda cls: cls.__name__)
def test_combine_fn_hints_pass_beams_check(cls):
    _bare(cls, beam.CombineFn).default_type_hints()


def test_a_none_annotation_is_what_beam_refuses():
    # The test above guards a real failure: on the installed Beam, `-> None` either fails
    # Beam's check outright (2.78 and later) or yields no element type at all.
    class EmitsAtBundleEnd(beam.DoFn):
        def process(self, element) -> None:
            pass

    try:
        hints = _bare(EmitsAtBundleEnd, beam.DoFn).default_type_hints()
    except (ValueError, TypeError) as error:
        assert "not iterable" in str(error)
    else:
        output = hints.simple_output_type("EmitsAtBundleEnd")
        assert output is None or output in (type(None), beam.typehints.Any)
