"""For Beam's --setup_file: Dataflow workers run `python setup.py sdist` on this
file to ship the package. The real metadata lives in pyproject.toml."""

from setuptools import setup

setup()
