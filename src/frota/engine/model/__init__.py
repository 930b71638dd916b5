"""Model definitions (the Llama family, dense or MoE)."""
