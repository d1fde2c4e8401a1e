"""`shoal demo`: the whole network on one machine (runner, chain, cast, report, live view)."""
