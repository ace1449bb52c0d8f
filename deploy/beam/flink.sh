#!/usr/bin/env bash
# Build shards on Flink through Beam's portable FlinkRunner (Beam starts the
# Flink job server; a Java 11+ runtime is needed).
#
#   FLINK_MASTER=host:8081 INPUT='s3://bucket/corpus/*.txt' OUTPUT=s3://bucket/shards \
#   bash deploy/beam/flink.sh
set -euo pipefail
: "${FLINK_MASTER:?set FLINK_MASTER}" "${INPUT:?set INPUT}" "${OUTPUT:?set OUTPUT}"
python -m pipeline build --input "$INPUT" --output "$OUTPUT" \
  --vocab_size "${VOCAB_SIZE:-30522}" --dupe_factor "${DUPE_FACTOR:-10}" \
  --runner=FlinkRunner --flink_master="$FLINK_MASTER" \
  --parallelism="${PARALLELISM:-16}" \
  --environment_type="${ENVIRONMENT_TYPE:-LOOPBACK}" "$@"
