"""Test helpers that are torch through and through (tests/helpers.py stays torch-free, so
that tests/pipeline runs on the base install). Import them as ``tests.torch_helpers``."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class CountHostSyncs(TorchDispatchMode):
    """Counts what waits for the device: a tensor read as Python numbers (.item(), int(),
    bool(); .tolist(), which on CPU bypasses the dispatcher) or a data-dependent shape."""

    SYNCS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default)

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in self.SYNCS
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        tolist = self._tolist = torch.Tensor.tolist

        def counted(tensor):
            self.count += 1
            return tolist(tensor)

        torch.Tensor.tolist = counted
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)
