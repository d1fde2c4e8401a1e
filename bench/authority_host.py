"""shoal's store and membership authority alone on a host of their own, for the
namespaced benchmarks: what a serving `shoal run` does, minus its workers.

torchft's lighthouse and torchrun's rendezvous store run apart from the
trainers; `shoal run --serve` needs at least one worker of its own, so the
benchmark hosts shoal's control plane with this instead, the same way
(shoal.control.serve, the launcher's liveness settings), and every fault
then hits trainers only, for every system.

    python -m bench.authority_host --bind ADDR --port PORT --run-dir DIR --min-workers N
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

from shoal.control.authority import AuthorityConfig  # noqa: E402
from shoal.control.liveness import LivenessConfig  # noqa: E402
from shoal.control.serve import RendezvousServer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--min-workers", type=int, required=True)
    parser.add_argument("--stall-deadline-s", type=float, default=1.0)
    parser.add_argument("--linger-s", type=float, default=10.0)
    args = parser.parse_args()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    server = RendezvousServer(args.bind, args.port)
    (args.run_dir / "launch.json").write_text(json.dumps({"t0": time.time()}))
    server.start_authority(
        AuthorityConfig(min_workers=args.min_workers,
                        liveness=LivenessConfig(floor_s=args.stall_deadline_s)),
        process_alive=lambda worker: None,  # no worker runs here; launchers report exits
        event_log=args.run_dir / "epochs.jsonl")
    try:
        while not server.rdzv.done():
            if server.rdzv.failure():
                raise SystemExit(f"the authority gave the run up: {server.rdzv.failure()}")
            time.sleep(0.1)
        server.stop_authority()
        (args.run_dir / "final.json").write_text(json.dumps(server.rdzv.final()))
        time.sleep(args.linger_s)  # other hosts' workers may still read the store
    finally:
        server.close()


if __name__ == "__main__":
    main()
