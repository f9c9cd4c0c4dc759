"""What the stack says and what is true everywhere: the settings, the machine, capacity, model and store tables,
releases and images, and where things live on the host and on the laptop. Imports nothing of tpu-grpo above it."""
