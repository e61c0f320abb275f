"""The one EIP-681 builder: what wallets read from the payment and refund links."""

from payments.eip681 import payment_request_uri

TO = "0x" + "ab" * 20
TOKEN = "0x" + "cd" * 20


def test_a_token_transfer_names_the_contract_the_recipient_and_the_units():
    uri = payment_request_uri(chain_id=137, to=TO, units=1_500_000, token=TOKEN)

    assert uri == (
        "ethereum:0xCdCDCdCdcdcdcdCdcDcDCdcDcDCdCdcdCdcDCDcD@137/transfer"
        "?address=0xABaBaBaBABabABabAbAbABAbABabababaBaBABaB&uint256=1500000"
    )


def test_the_chains_coin_is_a_value_sent_to_the_recipient():
    assert payment_request_uri(chain_id=1, to=TO, units=10**18) == (
        "ethereum:0xABaBaBaBABabABabAbAbABAbABabababaBaBABaB@1?value=1000000000000000000"
    )
