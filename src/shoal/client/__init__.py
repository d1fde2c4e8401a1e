"""Talking to a coordinator: requests signed by an Ethereum key (`identity`) and the
client that sends them (`http`), shared by agents, verifiers and the CLI."""
