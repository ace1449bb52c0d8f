"""DaskRunner: memory a bundle frees stays with the worker process.

One ParDo bundle builds ~400 MB of 2 KB strings and keeps 1 in 100 of them
(what a DoFn's output or cache might keep); the rest is freed when the bundle
ends. Afterwards the worker's resident memory is read, then read again after
glibc's malloc_trim(0), which the DaskRunner never calls.
"""

import ctypes
import logging

import apache_beam as beam
import psutil
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.dask.dask_runner import DaskRunner
from dask.distributed import Client, LocalCluster


class Churn(beam.DoFn):
    def process(self, n):
        strings = [str(i).ljust(2000, "x") for i in range(200_000)]
        yield strings[::100]  # 2,000 kept, ~4 MB


def rss_mb():
    return psutil.Process().memory_info().rss / 2**20


def worker_rss_mb(client):
    (rss,) = client.run(rss_mb).values()  # the one worker's
    return rss


def trim():
    return ctypes.CDLL("libc.so.6").malloc_trim(0)


if __name__ == "__main__":
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, dashboard_address=":0", silence_logs=logging.ERROR
        ) as cluster,
        Client(cluster) as client,
    ):
        before = worker_rss_mb(client)
        options = PipelineOptions([f"--dask_client_address={cluster.scheduler_address}"])
        p = beam.Pipeline(runner=DaskRunner(), options=options)
        p | beam.Create([1]) | beam.ParDo(Churn())
        result = p.run()
        result.wait_until_finish()  # the bundle's output stays in worker memory
        after = worker_rss_mb(client)
        client.run(trim)
        trimmed = worker_rss_mb(client)
        print(
            f"worker RSS: {before:.0f} MB before the job, {after:.0f} MB after it, "
            f"{trimmed:.0f} MB after malloc_trim(0)"
        )
        if after - trimmed > 100:
            print("BUG: the worker kept memory its bundle had freed, until malloc_trim")
        result.client.close()
