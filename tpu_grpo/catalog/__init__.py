"""The tables tpu-grpo knows, which no stack setting changes: machines and slices, capacities and their prices, the
model table, checkpoint stores, MaxText's release and the slice's image. The lowest layer: it imports nothing else
of the project, and config/ (the stack's settings) reads it."""
