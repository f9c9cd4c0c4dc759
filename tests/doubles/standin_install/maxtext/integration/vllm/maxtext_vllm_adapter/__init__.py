"""Stand-in for MaxText's vLLM adapter: only its name and entry point matter to provisioning."""


def register():
    """vLLM calls this at startup; the real one registers MaxTextForCausalLM with tpu_inference."""
