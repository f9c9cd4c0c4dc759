"""Making a host ready: the playbooks, their engine (idempotent, check mode, a report), the lock, and a slice's
post-training image."""
