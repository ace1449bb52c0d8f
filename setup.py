"""For Beam's --setup_file (deploy/beam/dataflow.sh): Beam builds a source distribution
from this directory where the job is submitted, and every worker pip-installs it. The
metadata lives in pyproject.toml; its base dependencies are the pipeline's only, so
workers install no torch (model/ and trainer/ need the `train` extra)."""

from setuptools import setup

setup()
