// SPDX-License-Identifier: MIT
pragma solidity ^0.8.20;

/// @title MockAggregator
/// @notice Settable price feed exposing the subset of Chainlink's
///         AggregatorV3Interface that Binôme reads (`decimals`, `description`,
///         `latestRoundData`). For the demo and tests on a LOCAL anvil chain.
/// @dev    `setAnswer` is open to anyone on purpose (demo/test fixture only).
contract MockAggregator {
    uint8 private immutable _decimals;
    string private _description;

    uint80 private _roundId;
    int256 private _answer;
    uint256 private _startedAt;
    uint256 private _updatedAt;
    uint80 private _answeredInRound;

    event AnswerUpdated(int256 indexed current, uint256 indexed roundId, uint256 updatedAt);

    constructor(uint8 decimals_, int256 initialAnswer, string memory description_) {
        _decimals = decimals_;
        _description = description_;
        _setAnswer(initialAnswer);
    }

    function decimals() external view returns (uint8) {
        return _decimals;
    }

    function description() external view returns (string memory) {
        return _description;
    }

    function latestRoundData()
        external
        view
        returns (uint80 roundId, int256 answer, uint256 startedAt, uint256 updatedAt, uint80 answeredInRound)
    {
        return (_roundId, _answer, _startedAt, _updatedAt, _answeredInRound);
    }

    /// @notice Sets every field of the latest round as given: a stale answer, one carried over from an earlier
    ///         round (`answeredInRound` < `roundId`), as a misbehaving feed would report (tests only).
    function setRoundData(uint80 roundId, int256 answer, uint256 updatedAt, uint80 answeredInRound) external {
        _roundId = roundId;
        _answer = answer;
        _startedAt = updatedAt;
        _updatedAt = updatedAt;
        _answeredInRound = answeredInRound;
    }

    /// @notice Starts a new round with `answer`, timestamped with the current block.
    function setAnswer(int256 answer) external {
        _setAnswer(answer);
    }

    function _setAnswer(int256 answer) internal {
        _roundId += 1;
        _answer = answer;
        _startedAt = block.timestamp;
        _updatedAt = block.timestamp;
        _answeredInRound = _roundId;
        emit AnswerUpdated(answer, _roundId, block.timestamp);
    }
}
