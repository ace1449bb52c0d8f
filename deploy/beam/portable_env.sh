# Sourced by spark.sh and flink.sh: sets the array `environment` to Beam's flags saying
# where the Python workers run (deploy/beam/README.md, "Python workers on Spark and Flink").
#
#   ENVIRONMENT_TYPE=DOCKER (default)  each worker node starts the container $SDK_IMAGE, an
#                                       image with this package (deploy/beam/Dockerfile)
#   ENVIRONMENT_TYPE=LOOPBACK          all Python runs in this submitting process: for a
#                                       local Spark/Flink, not a cluster
#   ENVIRONMENT_TYPE=PROCESS|EXTERNAL  with ENVIRONMENT_CONFIG, as Beam documents them
env_type="${ENVIRONMENT_TYPE:-DOCKER}"
case "$env_type" in
  DOCKER)
    env_config="${SDK_IMAGE:?set SDK_IMAGE to a worker image with this package (build it from deploy/beam/Dockerfile), or ENVIRONMENT_TYPE=LOOPBACK for a local cluster}" ;;
  LOOPBACK) env_config="" ;;
  PROCESS | EXTERNAL)
    env_config="${ENVIRONMENT_CONFIG:?set ENVIRONMENT_CONFIG for ENVIRONMENT_TYPE=$env_type (see deploy/beam/README.md)}" ;;
  *)
    echo "ENVIRONMENT_TYPE must be DOCKER, LOOPBACK, PROCESS or EXTERNAL, got '$env_type'" >&2
    exit 2 ;;
esac
environment=(--environment_type="$env_type")
if [ -n "$env_config" ]; then
  environment+=(--environment_config="$env_config")
fi
