// SPDX-License-Identifier: MIT
pragma solidity ^0.8.20;

/// @title PaymentForwarder
/// @notice TEST ONLY. Pays native coin on to an address from inside a contract call,
///         as a smart-contract wallet or an exchange's batch payout does: the
///         deposit address receives it by an internal transaction, with no
///         transaction of its own and no log.
contract PaymentForwarder {
    function forward(address payable to) external payable {
        (bool ok, ) = to.call{value: msg.value}("");
        require(ok, "forward failed");
    }
}
