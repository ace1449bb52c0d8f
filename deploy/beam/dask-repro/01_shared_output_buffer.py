"""DaskRunner: the bundles of one ParDo append to one shared output list.

12 numbers in 4 partitions (4 bundles) go through one Map; the step after it
should see 12 elements. Run twice: on a Dask cluster whose worker runs in the
client's process (threads; Beam's own DaskRunner tests use one), and on the
DaskRunner's default local cluster (worker processes).
"""

import logging
import os
import tempfile

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.dask.dask_runner import DaskRunner
from dask.distributed import LocalCluster


def record(x, path):
    with open(path, "a") as f:
        f.write(f"{x}\n")


def elements_seen(extra_args):
    path = os.path.join(tempfile.mkdtemp(), "seen.txt")
    p = beam.Pipeline(
        runner=DaskRunner(), options=PipelineOptions(["--dask_npartitions=4", *extra_args])
    )
    (
        p
        | beam.Create(range(12))
        | "Double" >> beam.Map(lambda x: 2 * x)
        | "Record" >> beam.Map(record, path=path)
    )
    result = p.run()
    result.wait_until_finish()
    result.client.close()
    with open(path) as f:
        return sorted(int(line) for line in f)


if __name__ == "__main__":
    with LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=False,
        dashboard_address=":0",
        silence_logs=logging.ERROR,
    ) as cluster:
        threads = elements_seen([f"--dask_client_address={cluster.scheduler_address}"])
    processes = elements_seen([])
    print(f"in-process worker: {len(threads)} elements after Double (expected 12): {threads}")
    print(f"worker processes:  {len(processes)} elements after Double (expected 12)")
    if len(threads) != 12 or len(processes) != 12:
        print("BUG: a bundle returned the outputs of earlier bundles again")
