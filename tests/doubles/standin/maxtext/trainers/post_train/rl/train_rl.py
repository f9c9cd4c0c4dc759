"""Stand-in for `python3 -m maxtext.trainers.post_train.rl.train_rl` (see tests/doubles/standin/README.md)."""

import sys

from _standin import main

if __name__ == "__main__":
    sys.exit(main("maxtext.trainers.post_train.rl.train_rl"))
