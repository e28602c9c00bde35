"""`python -m grpo ...` is the `grpo` command (torchrun: `torchrun ... -m grpo train CONFIG`)."""

import sys

from grpo.cli import main

if __name__ == "__main__":
    sys.exit(main())
