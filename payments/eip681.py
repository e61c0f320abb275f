"""The EIP-681 payment request a wallet opens: one builder for what a customer pays (payments/selectors.py) and
what the operator refunds (payments/refunds.py).

Token: `ethereum:<token>@<chain>/transfer?address=<to>&uint256=<units>`;
native coin: `ethereum:<to>@<chain>?value=<wei>`.
"""

from payments.chain import checksum


def payment_request_uri(*, chain_id: int, to: str, units: int, token: str = "") -> str:
    """`units` of `token` (the chain's coin when empty) to `to`, both written as checksummed addresses."""
    if token:
        return f"ethereum:{checksum(token)}@{chain_id}/transfer?address={checksum(to)}&uint256={int(units)}"
    return f"ethereum:{checksum(to)}@{chain_id}?value={int(units)}"
