"""The reference systems bench/elastic.py compares shoal against, measured the same way:
static DDP (throughput), torchrun with checkpoint restart and torchft (recovery).

Only the torchft worker process imports torchft, so this package imports without it.
"""

from __future__ import annotations

import importlib

# Imported on first use, so that `python -m bench.reference.<module>` does not
# find its own module already imported by the package.
_EXPORTS = {
    "ReferenceRunError": "bench.reference.common",
    "static_ddp_throughput": "bench.reference.ddp_ref",
    "torchrun_under_plan": "bench.reference.torchrun_ref",
    "torchft_under_plan": "bench.reference.torchft_ref",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'bench.reference' has no attribute '{name}'")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
