"""The reference systems bench/elastic.py compares shoal against, measured the same way:
static DDP (throughput), torchrun with checkpoint restart and torchft (recovery).

Only the torchft worker process imports torchft, so this package imports without it.
"""

from bench.reference.common import FaultResult, ReferenceRunError
from bench.reference.ddp_ref import static_ddp_throughput
from bench.reference.torchft_ref import torchft_faults
from bench.reference.torchrun_ref import torchrun_faults

__all__ = [
    "FaultResult", "ReferenceRunError", "static_ddp_throughput", "torchft_faults",
    "torchrun_faults",
]
