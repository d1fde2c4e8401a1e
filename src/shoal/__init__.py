"""shoal: train neural networks on compute that comes and goes.

The package root stays light (no torch import) so that the pure layers,
the CLI's error paths and the simulator start fast.
"""

__version__ = "0.1.0"


class ShoalError(Exception):
    """Root of every error shoal raises for a user to act on.

    Each layer derives its own family from it; the CLI prints `str(error)`
    as one line and exits non-zero instead of showing a traceback.
    """


def join(config=None, proof=None):  # noqa: ANN001, ANN201 - torch loads only when a worker joins
    """Join the elastic job this process was launched for (see shoal.train.run.Run).

    `config`: a `shoal.train.run_config.RunConfig` (default: the launcher's, from the
    environment); `proof`: the job's `shoal.verify.work_records.ProofSettings` when it
    records work. Proof of learning reaches the run through a step hook built here:
    the recorder, and the adversary the launcher told this worker to be (rehearsals)."""
    from shoal.train.run import join as join_run
    from shoal.train.run_config import RunConfig
    from shoal.verify.adversary import load_adversary
    from shoal.verify.step_proof import StepProof

    config = config or RunConfig.from_env()
    adversary = load_adversary(config.settings.adversary)
    if adversary is None and proof is None:
        return join_run(config)
    return join_run(config, hook=StepProof(config.worker, adversary, proof))
