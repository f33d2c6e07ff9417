"""specter-models.

DeepSeek-V2, Qwen1.5-MoE and Phi-3.5-MoE on transformers with offloaded FP16 experts and
a shared-weight INT4 draft.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
