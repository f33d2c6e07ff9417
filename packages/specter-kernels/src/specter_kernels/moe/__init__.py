"""Mixture-of-Experts kernels: the router, the token-to-expert alignment, the draft's fused
W4A16 experts, the target's grouped FP16 experts and the MoE block's residual join."""
