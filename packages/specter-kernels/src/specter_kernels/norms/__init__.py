"""RMSNorm, alone and fused with the residual adds beside it."""
