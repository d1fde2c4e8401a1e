"""Job bundles: a submitter's own job, packed into one content-addressed archive
(issue 41). `pack` builds one from a script; `unpack` checks one that came from
someone else and writes it out. Plain Python (tarfile, hashlib): it imports only
`spec`, so the coordinator, the agents and the verifiers all use the same code.
"""

from shoal.bundle.pack import Bundle, BundleError, pack_bundle
from shoal.bundle.unpack import check_bundle, unpack_bundle

__all__ = ["Bundle", "BundleError", "check_bundle", "pack_bundle", "unpack_bundle"]
