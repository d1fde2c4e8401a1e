"""Sleeps a minute (a worker that only a kill ends)."""
import time

time.sleep(60)
