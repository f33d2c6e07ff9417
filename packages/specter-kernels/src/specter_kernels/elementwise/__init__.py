"""Elementwise activations: SwiGLU's ``silu(gate) * up``."""
