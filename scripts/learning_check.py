#!/usr/bin/env python3
"""The learning check (issue 14; docs/training.md, "Learning check"): SFT a small model built from a config on
a generated corpus, then GRPO against the real evaluator, with fast_0 / fast_1 / mean reward on held-out
problems before and after. Resumable phases under --out; --max-minutes per call.

    python scripts/learning_check.py --phase all --max-minutes 8.5
    python scripts/learning_check.py --help
"""

import sys

from kb_gym.training.learning_check import main

if __name__ == "__main__":
    sys.exit(main())
