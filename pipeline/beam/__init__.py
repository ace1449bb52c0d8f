"""The Beam jobs: build and export, their steps, the runner helpers."""
