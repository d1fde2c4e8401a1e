"""Imported first by the fork server of shoal.elastic.preload, before torch: from here on
the server dies with the launcher that started it (PR_SET_PDEATHSIG), even while it is
still importing. Otherwise a launcher that stops at once (a mistake on its command line,
a store out of reach) would leave it importing torch for seconds, holding the launcher's
stdout and stderr, and whoever reads those to their end would wait for it."""

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1

ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
if os.getppid() == 1:  # the launcher was gone before prctl took effect
    os._exit(0)
