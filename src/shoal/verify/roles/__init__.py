"""Proof of learning as roles: the verifier that audits work records, the
whistleblower that re-checks verifiers, the operator's forced errors, and
disputes settled by a referee on the chain."""
