"""What both scripts import: the vector env, the Atari wrappers gymnasium lacks, and the run plumbing."""

import os
import re
import sys

import gymnasium

_version = re.match(r"(\d+)\.(\d+)", gymnasium.__version__)
if _version is None or (int(_version[1]), int(_version[2])) < (1, 1):  # AutoresetMode and same-step resets
    raise SystemExit(
        f"{os.path.basename(sys.argv[0]) or 'python'}: error: ppo-vec needs gymnasium>=1.1,<2, this Python has "
        f"{gymnasium.__version__}: pip install 'gymnasium>=1.1,<2'"
    )
