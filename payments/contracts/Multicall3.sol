// SPDX-License-Identifier: MIT
pragma solidity ^0.8.20;

/// @title Multicall3 (aggregate3 only)
/// @notice TEST ONLY. The `aggregate3` function of Multicall3 (mds1/multicall,
///         deployed at 0xcA11bde05977b3631167028862bE2a173976CA11 on most
///         chains), with the same ABI: many read calls answered by one eth_call.
///         The tests deploy it on anvil, where it is not predeployed.
contract Multicall3 {
    struct Call3 {
        address target;
        bool allowFailure;
        bytes callData;
    }

    struct Result {
        bool success;
        bytes returnData;
    }

    function aggregate3(Call3[] calldata calls) public payable returns (Result[] memory returnData) {
        uint256 length = calls.length;
        returnData = new Result[](length);
        for (uint256 i = 0; i < length; i++) {
            Call3 calldata call = calls[i];
            Result memory result = returnData[i];
            (result.success, result.returnData) = call.target.call(call.callData);
            require(call.allowFailure || result.success, "Multicall3: call failed");
        }
    }
}
