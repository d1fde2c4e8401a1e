"""A bench's result history: `--record` appends the JSON line a bench printed to
`bench/results/NAME.jsonl`, with the commit, date and command that produced it.

History lives here and in git, not in the README (STYLE.md, 15); the docs site plots it.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"
PROVENANCE = ("commit", "date", "command")
RECORD_HELP = "append the printed result to bench/results/NAME.jsonl (off: nothing is kept)"


def append_result(bench: str, result: dict[str, object], results_dir: Path = RESULTS_DIR,
                  argv: Sequence[str] | None = None, repo: Path = REPO) -> Path:
    """Append `result` (the object the bench printed) with its provenance as one line of
    `results_dir/<bench>.jsonl`; returns the file's path. `argv`: the command's arguments
    after the interpreter (default: this process's, e.g. `-m bench.elastic --fault kill`)."""
    clash = [key for key in PROVENANCE if key in result]
    if clash:
        raise ValueError(f"bench {bench!r} already prints {clash}: rename them in its result, "
                         "history adds these keys itself")
    # The interpreter's own argv keeps `-m bench.elastic` as typed (sys.argv has a path).
    argv = sys.orig_argv[1:] if argv is None else argv
    line = {**result, "commit": commit_of(repo),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": shlex.join(["python", *argv])}
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{bench}.jsonl"
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")
    return path


def commit_of(repo: Path) -> str:
    """HEAD's short hash, with "+dirty" when tracked files other than bench/results differ
    from it (the result may come from code no commit holds); "unknown" outside a git
    checkout."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        # The results files themselves change with every recorded run: not the code's state.
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                    ":(exclude)bench/results")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")
