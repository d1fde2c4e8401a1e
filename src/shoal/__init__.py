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


def join(config=None):  # noqa: ANN001, ANN201 - the user-facing alias of shoal.train.join
    """Join the elastic job this process was launched for (see shoal.train.run.Run)."""
    from shoal.train.run import join as _join  # torch loads only when a worker joins

    return _join(config)
