"""Providers accept leases by signature (EIP-712), so accepting costs no transaction.

The typed data here must match `acceptance_digest` in the contract: the
domain binds the contract and the chain, the message the job and terms.
"""

from __future__ import annotations

from typing import Any

from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_account.signers.local import LocalAccount
from web3 import Web3

from shoal.spec.ledger import LeaseAcceptance

DOMAIN_NAME = "shoal compute market"
DOMAIN_VERSION = "1"
ACCEPTANCE_FIELDS = [
    {"name": "job", "type": "uint256"},
    {"name": "provider", "type": "address"},
    {"name": "price", "type": "uint256"},
    {"name": "termS", "type": "uint256"},
    {"name": "deadline", "type": "uint256"},
]


def typed_acceptance(
    chain_id: int, contract: str, job: int, provider: str, price_wei_per_s: int, term_s: int, deadline: int
) -> dict[str, Any]:
    """The EIP-712 message a provider signs to accept these terms (eth_signTypedData_v4 shape)."""
    return {
        "types": {
            "EIP712Domain": [
                {"name": "name", "type": "string"},
                {"name": "version", "type": "string"},
                {"name": "chainId", "type": "uint256"},
                {"name": "verifyingContract", "type": "address"},
            ],
            "LeaseAcceptance": ACCEPTANCE_FIELDS,
        },
        "primaryType": "LeaseAcceptance",
        "domain": {
            "name": DOMAIN_NAME,
            "version": DOMAIN_VERSION,
            "chainId": chain_id,
            "verifyingContract": Web3.to_checksum_address(contract),
        },
        "message": {
            "job": job,
            "provider": Web3.to_checksum_address(provider),
            "price": price_wei_per_s,
            "termS": term_s,
            "deadline": deadline,
        },
    }


def sign_acceptance(
    provider: LocalAccount,
    chain_id: int,
    contract: str,
    job: int,
    price_wei_per_s: int,
    term_s: int,
    deadline: int,
) -> LeaseAcceptance:
    """`provider`'s signed agreement to a lease on `job` at `contract`, valid until `deadline`."""
    message = typed_acceptance(chain_id, contract, job, provider.address, price_wei_per_s, term_s, deadline)
    signed = provider.sign_typed_data(full_message=message)
    return LeaseAcceptance(
        job=job,
        provider=provider.address,
        price_wei_per_s=price_wei_per_s,
        term_s=term_s,
        deadline=deadline,
        v=signed.v,
        r="0x" + signed.r.to_bytes(32, "big").hex(),
        s="0x" + signed.s.to_bytes(32, "big").hex(),
    )


def signer_of(acceptance: LeaseAcceptance, chain_id: int, contract: str) -> str:
    """The address that signed `acceptance` for `contract` on `chain_id`."""
    a = acceptance
    message = typed_acceptance(chain_id, contract, a.job, a.provider, a.price_wei_per_s, a.term_s, a.deadline)
    return Account.recover_message(encode_typed_data(full_message=message), vrs=(a.v, int(a.r, 16), int(a.s, 16)))


def acceptance_row(a: LeaseAcceptance) -> tuple:
    """`a` as the contract's `Acceptance` struct (provider, price, term, deadline, v, r, s)."""
    return (a.provider, a.price_wei_per_s, a.term_s, a.deadline, a.v, bytes.fromhex(a.r[2:]), bytes.fromhex(a.s[2:]))
