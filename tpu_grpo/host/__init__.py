"""A host and its files: SSH connections that verify keys, facts read from a host, files fetched with checksums
(from a host or a bucket), the TPU chips, and the programs that run on the host (remote/)."""
