"""Membership for one job: the authority and its rendezvous, the `shoal run` launcher and its
workers, liveness by progress, the job host, chaos schedules, run reports, and the gate
in front of the store. Workers (`shoal.train`) never import this."""
