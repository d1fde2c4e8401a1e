"""Ready-made models and loops that use the public `shoal.train` API like any
user script would: the built-in byte-level GPT, its corpus, its optimizer
and schedule, and its single-process training loop."""
