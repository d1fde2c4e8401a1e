"""Reading a job file (TOML) into a validated `JobSpec`.

Every way a file can be wrong becomes one `SpecError` line naming the file.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from shoal.spec.errors import SpecError, describe_validation_error
from shoal.spec.job import JobSpec


def parse_job(values: dict[str, Any], source: str = "job") -> JobSpec:
    try:
        return JobSpec.model_validate(values)
    except ValidationError as error:
        raise SpecError(describe_validation_error(error, JobSpec, source)) from None


def load_job(path: str | Path, overrides: dict[str, Any] | None = None) -> JobSpec:
    """Read and validate `path`; `overrides` are top-level keys set by the CLI."""
    path = Path(path)
    if not path.exists():
        raise SpecError(f"job file '{path}' not found; see examples/tiny-gpt.toml for one")
    if path.is_dir():
        raise SpecError(f"'{path}' is a directory; give the path of a job file (.toml)")
    try:
        values = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise SpecError(f"{path}: malformed TOML ({error})") from None
    except (OSError, UnicodeDecodeError) as error:
        raise SpecError(f"{path}: cannot read ({error})") from None
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return parse_job(values, source=str(path))


def refuse_for_providers(job: JobSpec) -> None:
    """A job run on strangers' machines may not name paths there to read.

    A corpus path would train on (and leak, through the model and its losses)
    whatever file of the provider's it names; until data ships with the job,
    market jobs use the built-in corpus. (Where checkpoints go is the agent's
    choice, whatever the file says.)
    """
    if job.data.corpus != "stdlib":
        raise SpecError(f"data.corpus = {job.data.corpus!r}: a job run on providers' machines "
                        "cannot read their files; use corpus = \"stdlib\"")
