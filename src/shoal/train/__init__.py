"""The training runtime on torch: model, data order, checkpoints, the loop."""
