"""How a client trusts a coordinator served over TLS: this machine's certificate
authorities, or one certificate pinned by its SHA-256 (a coordinator's self-signed
one), checked on every connection before a byte of a request is sent.

Over plain HTTP anyone on the path reads the gate tokens in heartbeat replies and
rewrites the lease terms agents sign; TLS with the right certificate closes that.
"""

from __future__ import annotations

import hashlib
import hmac
import ssl
from dataclasses import dataclass
from typing import Any

from shoal.errors import ControlError

CERT_SHA256_ENV = "SHOAL_COORDINATOR_CERT_SHA256"  # what --coordinator-cert-sha256 reads


@dataclass(frozen=True)
class CertificatePin:
    sha256: str  # of the certificate's DER bytes: 64 lowercase hex digits

    @classmethod
    def parse(cls, text: str) -> CertificatePin:
        """From hex as the coordinator prints it, or as openssl does (`AB:CD:…`)."""
        digits = text.strip().replace(":", "").lower()
        if len(digits) != 64 or any(c not in "0123456789abcdef" for c in digits):
            raise ControlError(f"a certificate's SHA-256 is 64 hex digits (the coordinator "
                               f"prints it when it starts); not {text!r}")
        return cls(digits)


class CertificateMismatch(ssl.SSLCertVerificationError):
    """The server showed a certificate other than the pinned one: no request was sent."""


class _PinningContext(ssl.SSLContext):
    """An SSL context that takes any certificate in the handshake, then refuses the
    connection unless it is the pinned one (a self-signed certificate names no CA and
    maybe no host name, so the hash is the whole check, as the job host's gate does)."""

    pin: CertificatePin

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        sock = super().wrap_socket(*args, **kwargs)
        try:
            if sock.getpeercert(binary_form=True) is None:  # handshake deferred by the caller
                sock.do_handshake()
            seen = hashlib.sha256(sock.getpeercert(binary_form=True)).hexdigest()
        except BaseException:
            sock.close()
            raise
        if not hmac.compare_digest(seen, self.pin.sha256):
            sock.close()
            raise CertificateMismatch(f"the server shows a certificate with SHA-256 {seen}, "
                                      f"not the pinned {self.pin.sha256}")
        return sock

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        # TLS inside TLS (an HTTPS proxy): the handshake happens after this returns, where
        # the check above cannot see it. Refuse rather than connect unchecked.
        raise ssl.SSLError("a pinned coordinator certificate cannot be checked through an "
                           "HTTPS proxy; reach the coordinator directly (unset HTTPS_PROXY)")


def client_context(pin: CertificatePin | None) -> ssl.SSLContext:
    """This machine's CAs and the host name checked; or, with `pin`, that certificate only."""
    if pin is None:
        return ssl.create_default_context()
    context = _PinningContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the pin replaces the chain: see wrap_socket
    context.pin = pin
    return context


def untrusted_certificate(error: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate refusal behind a failed connection (httpx wraps it twice), if any."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, ssl.SSLCertVerificationError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
