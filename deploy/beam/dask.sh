#!/usr/bin/env bash
# Build shards on Dask through Beam's DaskRunner: a local cluster by default, or
# an existing one with DASK_ADDRESS=tcp://scheduler:8786 (each worker needs this
# package: pip install '.[dask]', the pipeline's dependencies only). Needs: pip install -e '.[dask]'.
#
#   INPUT='corpus/*.txt' OUTPUT=shards bash deploy/beam/dask.sh
set -euo pipefail
: "${INPUT:?set INPUT}" "${OUTPUT:?set OUTPUT}"
address=()
[ -n "${DASK_ADDRESS:-}" ] && address=(--dask_client_address="$DASK_ADDRESS")
python -m pipeline build --input "$INPUT" --output "$OUTPUT" \
  --vocab_size "${VOCAB_SIZE:-30522}" --dupe_factor "${DUPE_FACTOR:-10}" \
  --runner=apache_beam.runners.dask.dask_runner.DaskRunner "${address[@]}" "$@"
