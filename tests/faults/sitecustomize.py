"""Loaded by Python at start-up when this folder is on PYTHONPATH: the fault injection of
the launch tests (fault_injection.py)."""

import fault_injection  # noqa: F401
