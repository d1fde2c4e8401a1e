"""Reports what a Python program sees of how it was started, then exits with the code
its first argument names (or raises, with `raise`)."""
import json
import os
import sys

import torch

print(json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
                  "env": os.environ.get("PROBE"), "threads": torch.get_num_threads(),
                  "pgid_is_pid": os.getpgid(0) == os.getpid(), "nice": os.nice(0)}), flush=True)
if sys.argv[1] == "raise":
    raise ValueError("the user's bug")
sys.exit(int(sys.argv[1]))
