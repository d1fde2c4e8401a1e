"""Values that cross the coordinator's API when a job's checkpoints are
carried between machines: an agent whose worker wrote a checkpoint sends it
to the coordinator, and an agent whose worker joins the job fetches it, so
the job's state survives the last machine that held it.

The checkpoint itself travels as the file the worker wrote: a state file
(safetensors with the state's shape in its header: step, cursor, model,
optimizer and RNG state), never a pickle.
"""

from __future__ import annotations

from pydantic import Field

from shoal.spec.base import Frozen

SHA256_HEX = r"^[0-9a-f]{64}$"


class CheckpointView(Frozen):
    """The coordinator's newest carried checkpoint of a job."""

    job_id: str
    step: int = Field(ge=0)  # steps completed: the state a step of this index starts from
    sha256: str = Field(pattern=SHA256_HEX)
    bytes: int = Field(ge=1)
    lease: int  # the lease whose agent sent it
    provider: str
    at_s: float
    # True: the parameters hash to what every work record of `step` says the step started
    # from. False: the job keeps no work records, and the checkpoint is taken on the word
    # of the provider that sent it, as a joiner takes live state from a peer.
    verified: bool
    stored: bool = True  # in an upload's reply: False when a newer one was already held
