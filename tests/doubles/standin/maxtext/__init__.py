"""Stand-in for MaxText 0.2.3 (tests only; see tests/doubles/standin/README.md)."""

__version__ = "0.2.3"
