"""Proof of learning on torch: what a worker commits at each step (work records, kept
files and their layout), audits and replay of a recorded step, the roles (verifier,
whistleblower, challenger) and the adversaries that tests and benches plant.

The training runtime never imports this room: it reaches proof of learning only
through the step hook a run is given (`shoal.train.hooks.StepHook`)."""
