"""A user's own adversary, loaded by `--adversary N=tests.control.trust.cheats:drift`."""


def drift(contribution, step, context):
    """Adds a small constant push to every coordinate: the kind of slow poisoning a
    distance threshold alone might let through, if it were loose."""
    return [t + 0.05 * t.abs().mean() for t in contribution]
