"""What the stack says: its settings (keys, rules, the stack file), the values they and the flags take, the errors
that name a bad one, and where things live on the host and on the laptop. Reads the catalogues (tpu_grpo/catalog/)
and nothing else of tpu-grpo."""
