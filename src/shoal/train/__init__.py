"""The training runtime on torch: model, data order, checkpoints, the elastic run.

`join()` is imported lazily so that `import shoal.train` stays cheap.
"""


def join(config=None):  # noqa: ANN001, ANN201 - re-export of shoal.train.run.join
    from shoal.train.run import join as _join

    return _join(config)
