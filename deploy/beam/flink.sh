#!/usr/bin/env bash
# Build shards on Flink through Beam's portable FlinkRunner (Beam starts the
# Flink job server; a Java 11+ runtime is needed).
#
#   FLINK_MASTER=host:8081 SDK_IMAGE=registry/bert-pipeline-worker:0.1.0 \
#   INPUT='s3://bucket/corpus/*.txt' OUTPUT=s3://bucket/shards bash deploy/beam/flink.sh
#
# The Python workers run in Docker on each task manager (--environment_type=DOCKER), in
# $SDK_IMAGE: Beam's SDK image with this package installed (deploy/beam/Dockerfile).
# ENVIRONMENT_TYPE=LOOPBACK runs them in this process instead: only for a local Flink.
# See deploy/beam/portable_env.sh and README.md.
set -euo pipefail
: "${FLINK_MASTER:?set FLINK_MASTER}" "${INPUT:?set INPUT}" "${OUTPUT:?set OUTPUT}"
# shellcheck source=deploy/beam/portable_env.sh
. "$(dirname "${BASH_SOURCE[0]}")/portable_env.sh"
python -m pipeline build --input "$INPUT" --output "$OUTPUT" \
  --vocab_size "${VOCAB_SIZE:-30522}" --dupe_factor "${DUPE_FACTOR:-10}" \
  --runner=FlinkRunner --flink_master="$FLINK_MASTER" \
  --parallelism="${PARALLELISM:-16}" "${environment[@]}" "$@"
