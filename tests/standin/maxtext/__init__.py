"""Stand-in for MaxText 0.2.3 (tests only; see tests/standin/README.md)."""

__version__ = "0.2.3"
