#!/usr/bin/env bash
# Build shards on Google Cloud Dataflow. Workers install this package through
# --setup_file (setup.py, whose metadata is pyproject.toml's): its base install, the
# pipeline's dependencies only (Beam, pyarrow, tokenizers, numpy; no torch). gs://
# paths work for --input, --output and --vocab_file.
#
#   PROJECT=my-project REGION=us-central1 BUCKET=gs://my-bucket \
#   INPUT='gs://my-bucket/corpus/*.txt' bash deploy/beam/dataflow.sh --dry_run
#
# Try --dry_run first (arguments after the script's go to the build): a user's first
# Dataflow attempt should fail here, not after workers start. It checks the inputs, has
# Beam validate the options (project id, region, gs:// temp and staging locations), builds
# the --setup_file package and translates the job for Dataflow, then stops before staging
# or submitting: nothing written, exit 0 with one line saying so (Beam's part needs no
# credentials; listing gs:// input does). It also warns of local --input/--output paths
# (workers cannot read them). Then run the same command without --dry_run.
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
