"""Proof of learning as the coordinator runs it: work records and proof epochs,
challenges and verdicts, planted errors, the referee, penalties, disputes and windows."""
