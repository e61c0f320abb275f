// SPDX-License-Identifier: MIT
pragma solidity ^0.8.20;

/// @title HostileEmitter
/// @notice TEST ONLY. Emits ERC-20 `Transfer`-shaped logs that no honest token
///         would: data of any length (a 64-byte amount, none at all), topics
///         missing or extra, huge amounts, and thousands of logs in one call.
///         Anyone can deploy such a contract on a public chain for a cent: the
///         scanner's tests use it to show that no log can stop a scan.
contract HostileEmitter {
    bytes32 private constant TRANSFER = keccak256("Transfer(address,address,uint256)");

    /// A Transfer log from the caller to `to` whose data is `data`, whatever its length.
    function transferWithData(address to, bytes calldata data) external {
        bytes memory payload = data;
        bytes32 topic = TRANSFER;
        bytes32 from = bytes32(uint256(uint160(msg.sender)));
        bytes32 recipient = bytes32(uint256(uint160(to)));
        assembly {
            log3(add(payload, 32), mload(payload), topic, from, recipient)
        }
    }

    /// A log with 0 to 4 topics exactly as given, and the given data.
    function rawLog(bytes32[] calldata topics, bytes calldata data) external {
        bytes memory payload = data;
        uint256 count = topics.length;
        require(count <= 4, "at most 4 topics");
        if (count == 0) {
            assembly {
                log0(add(payload, 32), mload(payload))
            }
        } else if (count == 1) {
            bytes32 t0 = topics[0];
            assembly {
                log1(add(payload, 32), mload(payload), t0)
            }
        } else if (count == 2) {
            bytes32 t0 = topics[0];
            bytes32 t1 = topics[1];
            assembly {
                log2(add(payload, 32), mload(payload), t0, t1)
            }
        } else if (count == 3) {
            bytes32 t0 = topics[0];
            bytes32 t1 = topics[1];
            bytes32 t2 = topics[2];
            assembly {
                log3(add(payload, 32), mload(payload), t0, t1, t2)
            }
        } else {
            bytes32 t0 = topics[0];
            bytes32 t1 = topics[1];
            bytes32 t2 = topics[2];
            bytes32 t3 = topics[3];
            assembly {
                log4(add(payload, 32), mload(payload), t0, t1, t2, t3)
            }
        }
    }

    /// `count` well-formed Transfer logs of `amount` to `to`, then to `to` + 1, + 2 ... (spam in one call).
    function spam(address to, uint256 count, uint256 amount) external {
        bytes32 topic = TRANSFER;
        bytes32 from = bytes32(uint256(uint160(msg.sender)));
        uint256 recipient = uint256(uint160(to));
        for (uint256 i = 0; i < count; i++) {
            bytes32 target = bytes32(recipient + i);
            assembly {
                mstore(0, amount)
                log3(0, 32, topic, from, target)
            }
        }
    }
}
