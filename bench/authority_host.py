"""shoal's store and membership authority alone on a host of their own, for the
namespaced benchmarks: `shoal rendezvous` (shoal.elastic.job_host), the way
torchft's lighthouse and torchrun's rendezvous store run apart from the
trainers, so every fault hits trainers only, for every system.

    python -m bench.authority_host --bind ADDR --port PORT --run-dir DIR --min-workers N
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

from shoal.elastic.job_host import JobHostConfig, serve_job  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--min-workers", type=int, required=True)
    parser.add_argument("--stall-deadline-s", type=float, default=1.0)
    parser.add_argument("--linger-s", type=float, default=10.0)
    args = parser.parse_args()
    final = serve_job(JobHostConfig(args.bind, args.port, args.run_dir, args.min_workers,
                                    args.stall_deadline_s, args.linger_s))
    if "failed" in final:
        raise SystemExit(f"the authority gave the run up: {final['failed']}")


if __name__ == "__main__":
    main()
