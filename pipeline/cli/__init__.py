"""The pipeline's command line: build, stats, inspect, validate, export, corpus."""
