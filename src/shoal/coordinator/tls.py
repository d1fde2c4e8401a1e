"""The certificate the coordinator's API is served with: the operator's own (from a CA
its clients trust), or a self-signed one made once in the data directory, whose
SHA-256 agents and clients pin (`--coordinator-cert-sha256`).

The self-signed one is made and served by the job host gate's key code (`GateKeys`),
so shoal has one way of making a certificate and one server context, not two.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes

from shoal.coordinator.settings import CoordinatorSettings
from shoal.errors import ControlError

SELF_SIGNED_DIR = "tls"  # under the data directory: kept, so agents' pins stay valid


@dataclass(frozen=True)
class ServedCertificate:
    sha256: str  # of the leaf certificate's DER bytes, as a client sees it in the handshake
    self_signed: bool
    context: Callable[[], ssl.SSLContext]  # the server's context, made when uvicorn asks


def served_certificate(settings: CoordinatorSettings) -> ServedCertificate | None:
    """The certificate to serve with, or None for plain HTTP (as the settings allow)."""
    if settings.tls_cert_file is not None:
        return _operators_certificate(settings.tls_cert_file, settings.tls_key_file)
    if settings.tls_self_signed:
        from shoal.elastic.gate_keys import GateKeys

        # The folder also holds a gate secret, which nothing here uses: the price of
        # making the certificate with the gate's own code rather than a second copy.
        keys = GateKeys.create_or_load(settings.data_dir / SELF_SIGNED_DIR)
        return ServedCertificate(keys.cert_sha256(), True, keys.server_context)
    return None


def _operators_certificate(cert_file: Path, key_file: Path | None) -> ServedCertificate:
    def context() -> ssl.SSLContext:
        served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        served.minimum_version = ssl.TLSVersion.TLSv1_2
        served.load_cert_chain(cert_file, key_file)
        return served

    try:
        context()  # now, so that a wrong file is said before the port is bound
        (leaf, *_) = x509.load_pem_x509_certificates(cert_file.read_bytes())
    except (OSError, ValueError, ssl.SSLError) as error:
        raise ControlError(f"cannot serve TLS with --tls-cert {cert_file} and --tls-key "
                               f"{key_file} ({error}); give a PEM certificate (its chain after "
                               "it) and the PEM private key that matches it") from None
    return ServedCertificate(leaf.fingerprint(hashes.SHA256()).hex(), False, context)
