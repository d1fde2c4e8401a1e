"""The coordinator's services: the market and the store kept in step, one service per
concern, each given its collaborators in its constructor."""
