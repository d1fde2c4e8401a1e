"""The training runtime on torch: model, data order, checkpoints, the elastic run.

A worker joins its run with `shoal.join()` (which hands the run its proof hook);
`shoal.train.run.join` is the runtime's own entry.
"""
