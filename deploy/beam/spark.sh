#!/usr/bin/env bash
# Build shards on Spark through Beam's portable SparkRunner. Beam starts its Spark
# job server itself (a Java 11+ runtime is needed); point it at your master.
#
#   SPARK_MASTER=spark://host:7077 INPUT='hdfs:///corpus/*.txt' OUTPUT=hdfs:///shards \
#   bash deploy/beam/spark.sh
#
# Workers run Python in Docker by default (--environment_type=DOCKER); with
# --environment_type=PROCESS or LOOPBACK they must have this package installed.
set -euo pipefail
: "${SPARK_MASTER:?set SPARK_MASTER}" "${INPUT:?set INPUT}" "${OUTPUT:?set OUTPUT}"
python -m pipeline build --input "$INPUT" --output "$OUTPUT" \
  --vocab_size "${VOCAB_SIZE:-30522}" --dupe_factor "${DUPE_FACTOR:-10}" \
  --runner=SparkRunner --spark_master_url="$SPARK_MASTER" \
  --environment_type="${ENVIRONMENT_TYPE:-LOOPBACK}" "$@"
