"""The control plane: who is in a job and where its workers run.

The membership authority and its rendezvous, the local launcher of
`shoal run` with its chaos schedule, and the run report built from what
the workers left on disk. Workers (`shoal.train`) never import this.
"""
