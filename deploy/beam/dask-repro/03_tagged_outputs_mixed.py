"""DaskRunner: every reader of a multi-output ParDo reads all of its outputs.

A ParDo sends even numbers to its main output and odd ones to the "odd" tag;
each output is labelled by its reader, then both are flattened and recorded.
Expected: even -> [0, 2, 4], odd -> [1, 3, 5].
"""

import os
import tempfile

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.dask.dask_runner import DaskRunner


class Split(beam.DoFn):
    def process(self, x):
        if x % 2:
            yield beam.pvalue.TaggedOutput("odd", x)
        else:
            yield x


def record(pair, path):
    tag, x = pair
    with open(path, "a") as f:
        f.write(f"{tag} {x}\n")


if __name__ == "__main__":
    path = os.path.join(tempfile.mkdtemp(), "seen.txt")
    with beam.Pipeline(runner=DaskRunner(), options=PipelineOptions([])) as p:
        split = p | beam.Create(range(6)) | beam.ParDo(Split()).with_outputs("odd", main="even")
        even = split.even | "LabelEven" >> beam.Map(lambda x: ("even", x))
        odd = split.odd | "LabelOdd" >> beam.Map(lambda x: ("odd", x))
        (even, odd) | beam.Flatten() | beam.Map(record, path=path)
    seen = {"even": [], "odd": []}
    with open(path) as f:
        for line in f:
            tag, x = line.split()
            seen[tag].append(int(x))
    for tag in seen:
        print(f"reader of {tag!r} got {sorted(seen[tag])}")
    wrong = seen != {"even": [0, 2, 4], "odd": [1, 3, 5]}
    print("BUG: each reader got every output" if wrong else "ok")
