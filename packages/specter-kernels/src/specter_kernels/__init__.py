"""specter-kernels.

INT4 (GPTQ-layout) quantization and fused W4A16 / grouped FP16 Mixture-of-Experts
kernels in Triton, each with a plain-torch reference.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
