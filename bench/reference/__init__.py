"""The reference systems bench/elastic.py compares shoal against, measured the same way:
static DDP (throughput), torchrun with checkpoint restart and torchft (recovery)."""
