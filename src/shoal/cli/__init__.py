"""The `shoal` command: thin shells over the layers, one subcommand each."""
