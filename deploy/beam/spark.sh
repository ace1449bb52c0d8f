#!/usr/bin/env bash
# Build shards on Spark through Beam's portable SparkRunner. Beam starts its Spark
# job server itself (a Java 11+ runtime is needed); point it at your master.
#
#   SPARK_MASTER=spark://host:7077 SDK_IMAGE=registry/bert-pipeline-worker:0.1.0 \
#   INPUT='hdfs:///corpus/*.txt' OUTPUT=hdfs:///shards bash deploy/beam/spark.sh
#
# The Python workers run in Docker on each worker node (--environment_type=DOCKER), in
# $SDK_IMAGE: Beam's SDK image with this package installed (deploy/beam/Dockerfile).
# ENVIRONMENT_TYPE=LOOPBACK runs them in this process instead: only for a local Spark.
# See deploy/beam/portable_env.sh and README.md.
set -euo pipefail
: "${SPARK_MASTER:?set SPARK_MASTER}" "${INPUT:?set INPUT}" "${OUTPUT:?set OUTPUT}"
# shellcheck source=deploy/beam/portable_env.sh
. "$(dirname "${BASH_SOURCE[0]}")/portable_env.sh"
python -m pipeline build --input "$INPUT" --output "$OUTPUT" \
  --vocab_size "${VOCAB_SIZE:-30522}" --dupe_factor "${DUPE_FACTOR:-10}" \
  --runner=SparkRunner --spark_master_url="$SPARK_MASTER" "${environment[@]}" "$@"
