"""Compile the market contract with vyper and write its ABI and bytecode.

Run `python -m shoal.ledger.build` after editing a `.vy` file; the package
ships the output (build/*.json) so that no compiler runs at start-up.
vyper is a test/build-time dependency only, imported here and nowhere else.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from shoal.ledger.artifact import ARTIFACT_DIR, CONTRACTS, source_digest
from shoal.ledger.errors import ArtifactError

SOURCE_DIR = Path(__file__).resolve().parent


def compile_contract(name: str) -> dict[str, Any]:
    """The artifact (ABI, deploy bytecode, provenance) of contract `name`."""
    try:
        import vyper
    except ImportError as error:
        raise ArtifactError(
            "vyper is not installed; install the test extra: pip install -e '.[test]'"
        ) from error
    source_path = SOURCE_DIR / f"{name}.vy"
    source = source_path.read_text()
    # The EVM version is pinned by the source's pragma, so the output does not
    # depend on the compiler's default.
    out = vyper.compile_code(source, output_formats=["abi", "bytecode"])
    return {
        "contract": name,
        "vyper": vyper.__version__,
        "source_sha256": source_digest(source),
        "abi": out["abi"],
        "bytecode": out["bytecode"],
    }


def render(artifact: dict[str, Any]) -> str:
    """The artifact as written to disk: stable key order, one trailing newline."""
    return json.dumps(artifact, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if build/ is out of date")
    args = parser.parse_args(argv)
    ARTIFACT_DIR.mkdir(exist_ok=True)
    stale = []
    for name in CONTRACTS:
        text = render(compile_contract(name))
        target = ARTIFACT_DIR / f"{name}.json"
        if target.exists() and target.read_text() == text:
            continue
        stale.append(name)
        if not args.check:
            target.write_text(text)
            print(f"wrote {target}")
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run python -m shoal.ledger.build", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
