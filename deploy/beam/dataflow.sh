#!/usr/bin/env bash
# Build shards on Google Cloud Dataflow. Workers install this package through
# --setup_file (setup.py, whose metadata is pyproject.toml's): its base install, the
# pipeline's dependencies only (Beam, pyarrow, tokenizers, numpy; no torch). gs://
# paths work for --input, --output and --vocab_file.
#
#   PROJECT=my-project REGION=us-central1 BUCKET=gs://my-bucket \
#   INPUT='gs://my-bucket/corpus/*.txt' bash deploy/beam/dataflow.sh
#
# Needs: pip install -e '.[gcp]' and gcloud credentials. Worker sizing: the
# vocab step holds the word-count table (distinct words) in one worker, and
# each bucket of --bucket_size documents sits in memory while it is paired;
# n2-highmem-4 workers are ample for Wikipedia-scale input.
set -euo pipefail
: "${PROJECT:?set PROJECT}" "${REGION:?set REGION}" "${BUCKET:?set BUCKET}" "${INPUT:?set INPUT}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python -m pipeline build \
  --input "$INPUT" --output "${OUTPUT:-$BUCKET/shards}" \
  --vocab_size "${VOCAB_SIZE:-30522}" --dupe_factor "${DUPE_FACTOR:-10}" \
  --runner=DataflowRunner --project="$PROJECT" --region="$REGION" \
  --temp_location="$BUCKET/tmp" --staging_location="$BUCKET/staging" \
  --setup_file="$root/setup.py" \
  --machine_type="${MACHINE_TYPE:-n2-highmem-4}" --max_num_workers="${MAX_WORKERS:-64}" \
  "$@"
