"""What both scripts import: the vector env, the run plumbing, the Atari preprocessing. It needs
gymnasium >= 1.1."""

import gymnasium

# same-step resets
if tuple(int(part) for part in gymnasium.__version__.split(".")[:2] if part.isdigit()) < (1, 1):
    raise SystemExit(
        f"ppo-vec: error: it needs gymnasium>=1.1,<2, this Python has {gymnasium.__version__}: "
        "pip install 'gymnasium>=1.1,<2'"
    )
