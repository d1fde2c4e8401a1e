"""Signed verdicts: a verifier stands behind each conclusion with its key,
so a whistleblower or a referee can hold exactly that verifier to it.

The signature is EIP-191 over the verdict's canonical JSON; the log is one
signed verdict per line under the job's proof directory.
"""

from __future__ import annotations

import json
from pathlib import Path

from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount

from shoal import jsonl
from shoal.proof.layout import ProofLayout
from shoal.spec.base import Frozen
from shoal.spec.proof import Verdict


class SignedVerdict(Frozen):
    verdict: Verdict
    signature: str  # 0x-hex EIP-191 signature by verdict.verifier

    def signer(self) -> str:
        """The address that signed (it must equal verdict.verifier to count)."""
        try:
            return Account.recover_message(encode_defunct(text=_message(self.verdict)),
                                           signature=self.signature)
        except Exception:  # noqa: BLE001 - any malformed signature verifies as nobody
            return ""

    @property
    def authentic(self) -> bool:
        return self.signer().lower() == self.verdict.verifier.lower() != ""


def _message(verdict: Verdict) -> str:
    return "shoal-verdict-v1:" + json.dumps(verdict.model_dump(mode="json"), sort_keys=True,
                                            separators=(",", ":"))


def sign_verdict(verdict: Verdict, account: LocalAccount) -> SignedVerdict:
    verdict = verdict.model_copy(update={"verifier": account.address})
    signed = account.sign_message(encode_defunct(text=_message(verdict)))
    return SignedVerdict(verdict=verdict, signature="0x" + signed.signature.hex().removeprefix("0x"))


class VerdictLog:
    """Every verdict a verifier signed for the job (`ProofLayout.verdicts`)."""

    def __init__(self, proof_dir: str | Path) -> None:
        self.layout = ProofLayout(Path(proof_dir))

    def append(self, signed: SignedVerdict) -> None:
        jsonl.append(self.layout.verdicts(signed.verdict.verifier), signed.model_dump_json())

    def read(self, verifier: str | None = None) -> list[SignedVerdict]:
        """Verdicts that verify (a line whose signature fails is dropped, not trusted)."""
        paths = [self.layout.verdicts(verifier)] if verifier else \
            sorted(self.layout.verdicts_dir.glob("*.jsonl"))
        out = []
        for path in paths:
            for line in jsonl.read(path)[0]:
                signed = SignedVerdict.model_validate_json(line)
                if signed.authentic:
                    out.append(signed)
        return out
