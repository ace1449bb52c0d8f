#!/usr/bin/env bash
# Build shards on Dask through Beam's DaskRunner: a throwaway local cluster by default,
# or a running one with DASK_ADDRESS. Needs: pip install '.[dask]' (here and on every
# machine of the cluster). deploy/beam/README.md ("Dask") explains each choice.
#
# A cluster of real machines, started as Dask's CLI starts one:
#
#   # every machine (scheduler, workers, and where you submit): the same Python, and
#   pip install '.[dask]'            # or a checkout on PYTHONPATH: the scheduler unpickles
#                                    # the task graph, the workers run the pipeline's code
#   # one machine:
#   dask scheduler --port 8786
#   # each worker machine: one single-threaded process per core, memory per process
#   dask worker tcp://SCHEDULER:8786 --nworkers "$(nproc)" --nthreads 1 \
#     --memory-limit 6GiB --local-directory /mnt/local-disk/dask   # spill space
#   # input and output on storage every machine reaches at the same path: a shared
#   # file system mounted alike, or gs:// (apache-beam[gcp]) / s3:// (apache-beam[aws])
#   # with credentials on every worker
#   DASK_ADDRESS=tcp://SCHEDULER:8786 \
#     INPUT='s3://bucket/corpus/*.txt' OUTPUT=s3://bucket/shards bash deploy/beam/dask.sh
#
# PARTITIONS (--dask_npartitions) is how many parts the DaskRunner cuts the list of input
# ranges into, and every later step keeps that many. Unset, the build makes it the number
# of ranges its files are read in (its first line says how many; --input_split_mb sizes
# them): each task then holds one range's documents, whatever the files.
#
#   INPUT='corpus/*.txt' OUTPUT=shards bash deploy/beam/dask.sh      # local cluster
set -euo pipefail
: "${INPUT:?set INPUT}" "${OUTPUT:?set OUTPUT}"
extra=()
[ -n "${DASK_ADDRESS:-}" ] && extra+=(--dask_client_address="$DASK_ADDRESS")
[ -n "${PARTITIONS:-}" ] && extra+=(--dask_npartitions="$PARTITIONS")
python -m pipeline build --input "$INPUT" --output "$OUTPUT" \
  --vocab_size "${VOCAB_SIZE:-30522}" --dupe_factor "${DUPE_FACTOR:-10}" \
  --runner=apache_beam.runners.dask.dask_runner.DaskRunner "${extra[@]}" "$@"
