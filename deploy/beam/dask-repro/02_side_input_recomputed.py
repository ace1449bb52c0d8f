"""DaskRunner: a side input is computed again, its whole upstream, by each bundle
that reads it (bundles that ask at the same moment share one computation).

The side input is 5 elements made by one Map ("Expensive"); the main input is 8
elements in 4 partitions (4 bundles), which reach the side input at staggered
times. Expected: "Expensive" processes 5 elements once. Runs on the DaskRunner's
default local cluster (worker processes); the count varies from run to run.
"""

import os
import tempfile
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.dask.dask_runner import DaskRunner


def expensive(x, path):
    with open(path, "a") as f:  # one line per call, from any worker process
        f.write(f"{os.getpid()}\n")
    return x


def slow(x):
    time.sleep(0.5 * x)  # so that the 4 bundles reach the side input one after another
    return x


def use(x, side):
    return x + sum(side)


def record(x, path):
    with open(path, "a") as f:
        f.write(f"{x}\n")


if __name__ == "__main__":
    tmp = tempfile.mkdtemp()
    calls, out = os.path.join(tmp, "calls.txt"), os.path.join(tmp, "out.txt")
    options = PipelineOptions(["--dask_npartitions=4"])
    with beam.Pipeline(runner=DaskRunner(), options=options) as p:
        side = p | "Side" >> beam.Create(range(5)) | "Expensive" >> beam.Map(expensive, path=calls)
        (
            p
            | "Main" >> beam.Create(range(8))
            | "Slow" >> beam.Map(slow)
            | "Use" >> beam.Map(use, side=beam.pvalue.AsList(side))
            | "Record" >> beam.Map(record, path=out)
        )
    with open(calls) as f:
        n_calls = len(f.readlines())
    with open(out) as f:
        n_out = len(f.readlines())
    print(f"main output: {n_out} elements (expected 8)")
    print(f"'Expensive' ran {n_calls} times for 5 side-input elements (expected 5)")
    print("BUG: side input recomputed by later bundles" if n_calls > 5 else "ok")
