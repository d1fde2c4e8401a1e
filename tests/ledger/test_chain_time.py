"""Time travel on the embedded chain, as the demo uses it to close a dispute window."""

from __future__ import annotations

import time

from shoal.ledger import Chain


def test_time_moves_on_after_a_quiet_spell_longer_than_the_step():
    """The demo's chain mined nothing for over a minute (a loaded machine), then moved a
    60 s window on from its latest block: that target lay behind the wall clock, and
    eth-tester refused ("Traveling backwards in time"), failing the demo at its end."""
    chain = Chain.embedded()
    payer, payee = chain.dev_accounts()[:2]
    time.sleep(2.2)  # nothing mined for longer than the step below...
    chain.w3.eth.send_transaction({"from": payer.address, "to": payee.address, "value": 1})
    # ...so the block just mined kept the old time, and the next one has the wall clock's.
    after = chain.advance_time(1)  # before: "Space time continuum distortion detected"
    assert after >= int(time.time())  # a second on from the wall clock, not the old block
