"""Stand-in for `python3 -m maxtext.checkpoint_conversion.to_maxtext` (see tests/doubles/standin/README.md)."""

import sys

from _standin import main

if __name__ == "__main__":
    sys.exit(main("maxtext.checkpoint_conversion.to_maxtext"))
