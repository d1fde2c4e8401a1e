"""The keys of a job host's gate: a TLS certificate its clients pin, and a secret
that turns an identity (`lease:7`, `coordinator`) into that identity's token.

A job's rendezvous store (c10d's TCPStore) authenticates nobody, and in a market
job anyone who learns the host's address could write the keys the runtime acts
on (`failed`, a step's decision, who is to be dropped). So the coordinator keeps
these keys beside the job's run directory and hands each lease, through its
signed API, the token of that lease and the certificate's fingerprint; the gate
(`shoal.elastic.gate`) admits only a connection that shows a token.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import hmac
import json
import os
import secrets
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from shoal.errors import ControlError
from shoal.spec.coordinator import RendezvousPass

PASS_ENV = "SHOAL_RENDEZVOUS_PASS"  # how an agent hands its launcher the pass (JSON)
_SECRET, _CERT, _KEY, _REVOKED = "secret", "cert.pem", "key.pem", "revoked.json"
_TOKEN_DOMAIN = b"shoal/rendezvous-gate/token\x00"


def lease_identity(lease: int) -> str:
    """The gate identity of a lease's worker (and its launcher)."""
    return f"lease:{lease}"


@dataclass(frozen=True)
class GateKeys:
    folder: Path  # holds the secret, the certificate and its private key (mode 0600)
    secret: bytes
    cert_pem: bytes

    @classmethod
    def create_or_load(cls, folder: Path) -> GateKeys:
        """The keys in `folder`, made there first if it holds none: a fresh 32-byte secret
        and a self-signed P-256 certificate (the clients pin it; no CA is involved)."""
        if not (folder / _SECRET).exists():
            _create(folder)
        return cls.load(folder)

    @classmethod
    def load(cls, folder: Path) -> GateKeys:
        try:
            secret = bytes.fromhex((folder / _SECRET).read_text().strip())
            cert_pem = (folder / _CERT).read_bytes()
        except (OSError, ValueError) as error:
            raise ControlError(f"no readable gate keys in {folder} ({error}); the job host's "
                               "gate keys are made by the coordinator when it starts the host "
                               "(or by `shoal rendezvous --gate-dir`)") from None
        if len(secret) < 32:
            raise ControlError(f"the gate secret in {folder} is shorter than 32 bytes")
        return cls(folder, secret, cert_pem)

    def token(self, identity: str) -> str:
        """The token of `identity`: HMAC-SHA256 under the secret (the gate recomputes it,
        so it keeps no list of who may come in)."""
        return hmac.new(self.secret, _TOKEN_DOMAIN + identity.encode(), hashlib.sha256).hexdigest()

    def admits(self, identity: str, token: str) -> bool:
        return hmac.compare_digest(self.token(identity), token)

    @functools.cached_property
    def _cert_sha256(self) -> str:
        return cert_sha256(self.cert_pem)

    def cert_sha256(self) -> str:
        """Of the certificate the gate shows (computed once: every heartbeat's pass names it)."""
        return self._cert_sha256

    def gate_pass(self, identity: str) -> RendezvousPass:
        """What `identity` shows the gate: its token, and the certificate to pin."""
        return RendezvousPass(identity=identity, token=self.token(identity),
                              cert_sha256=self.cert_sha256())

    def revoke(self, identities: set[str]) -> None:
        """Say that these identities' tokens no longer open the gate (a lease that ended:
        its token stays a valid HMAC for ever, so the gate must be told)."""
        _write_private(self.folder / _REVOKED, json.dumps(sorted(identities)).encode())

    def revoked(self) -> frozenset[str]:
        """The identities revoked so far (read from the folder: the coordinator writes it,
        the gate, in another process, reads it)."""
        try:
            return frozenset(json.loads((self.folder / _REVOKED).read_text()))
        except FileNotFoundError:
            return frozenset()
        except (OSError, ValueError, TypeError) as error:
            raise ControlError(f"the gate's list of revoked tokens in {self.folder} is "
                               f"unreadable ({error}); every token is refused until it is "
                               "written again") from None

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_cert_chain(self.folder / _CERT, self.folder / _KEY)
        return context


def cert_sha256(pem: bytes) -> str:
    """The SHA-256 of a PEM certificate's DER bytes, as a client sees it in the handshake."""
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem.decode())).hexdigest()


def _create(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shoal job host")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .sign(key, hashes.SHA256()))
    _write_private(folder / _KEY, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    _write_private(folder / _CERT, cert.public_bytes(serialization.Encoding.PEM))
    # The secret last: its presence says the folder is complete.
    _write_private(folder / _SECRET, secrets.token_bytes(32).hex().encode())


def _write_private(path: Path, data: bytes) -> None:
    partial = path.with_suffix(".partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(data)
    partial.replace(path)
