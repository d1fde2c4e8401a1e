// Hardhat Network config for the ledger tests: the contract is compiled by
// vyper in Python, so Hardhat only serves JSON-RPC; chain id and hardfork are
// fixed so the tests see the same EVM rules as the embedded py-evm chain.
module.exports = {
  networks: {
    hardhat: {
      chainId: 31337,
      hardfork: "prague",
      mining: { auto: true, interval: 0 },
    },
  },
};
