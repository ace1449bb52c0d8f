"""DaskRunner: a GroupByKey shuffles in as many partitions as its input has, and
Dask's task shuffle makes about n*n tasks for n partitions (n up to 32, then
about n*sqrt(n) per stage); there is no option to shuffle in fewer.

The same 640 (key, value) pairs, 16 keys, are grouped with the input cut into
n = 4, 16, 64 partitions; the script counts the tasks the Dask workers ran.
"""

import logging

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.dask.dask_runner import DaskRunner
from dask.distributed import Client, LocalCluster, get_task_stream


def tasks_run(address, client, npartitions):
    options = PipelineOptions(
        [f"--dask_npartitions={npartitions}", f"--dask_client_address={address}"]
    )
    with get_task_stream(client) as stream:
        p = beam.Pipeline(runner=DaskRunner(), options=options)
        (
            p
            | beam.Create([(i % 16, i) for i in range(640)])
            | beam.GroupByKey()
            | beam.MapTuple(lambda key, values: (key, sum(values)))
        )
        result = p.run()
        result.wait_until_finish()
        result.client.close()
    return len(stream.data)


if __name__ == "__main__":
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, dashboard_address=":0", silence_logs=logging.ERROR
        ) as cluster,
        Client(cluster) as client,
    ):
        for n in (4, 16, 64):
            print(
                f"npartitions={n}: {tasks_run(cluster.scheduler_address, client, n)} "
                "tasks for 640 elements and 16 keys"
            )
