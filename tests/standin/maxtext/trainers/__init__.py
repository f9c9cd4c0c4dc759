"""Stand-in package (see tests/standin/README.md)."""
