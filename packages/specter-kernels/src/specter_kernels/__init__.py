"""specter-kernels.

INT4 (GPTQ-layout) quantization and fused W4A16 / grouped FP16 Mixture-of-Experts
kernels in Triton, each with a plain-torch reference.

``BatchInvariantMode`` (``with batch_invariant():``) routes matmuls, last-dim
reductions, norms and attention to kernels whose per-row results do not depend
on the number of rows (speculative verification vs plain decoding).

Kernels dispatch to Triton on CUDA and to their torch reference elsewhere; set
``SPECTER_KERNELS_BACKEND`` to ``auto``, ``triton`` or ``torch`` to override.

The modules live in subpackages by what they serve: ``quant``, ``moe``, ``streaming``,
``attention``, ``norms``, ``elementwise``, ``sampling`` and ``invariant``; this module
gathers their public names.
"""

from specter_kernels.attention.mla_attention import mla_attention, mla_attention_reference
from specter_kernels.attention.mla_prologue import (
    MAX_LATENT,
    mla_prologue,
    mla_prologue_absorb,
    mla_prologue_absorb_reference,
    mla_prologue_reference,
)
from specter_kernels.attention.rotary import (
    rotary_complex,
    rotary_complex_reference,
    rotary_half,
    rotary_half_reference,
)
from specter_kernels.backend import BACKEND_ENV_VAR, FLOAT_DTYPES, select_backend
from specter_kernels.elementwise.silu_and_mul import silu_and_mul, silu_and_mul_reference
from specter_kernels.invariant.attention import invariant_attention
from specter_kernels.invariant.matmul import (
    invariant_bmm,
    invariant_bmm_reference,
    invariant_linear,
    invariant_mm,
)
from specter_kernels.invariant.matmul_config import MatmulConfig, matmul_config
from specter_kernels.invariant.mode import BatchInvariantMode, batch_invariant
from specter_kernels.invariant.reductions import (
    invariant_layer_norm,
    invariant_log_softmax,
    invariant_mean,
    invariant_rms_norm,
    invariant_row_sum,
    invariant_row_sum_reference,
    invariant_softmax,
)
from specter_kernels.moe.align import (
    max_aligned_blocks,
    moe_align_block_size,
    moe_align_block_size_reference,
)
from specter_kernels.moe.fused_w4a16 import fused_moe_w4a16, fused_moe_w4a16_reference
from specter_kernels.moe.grouped_fp16 import (
    grouped_moe_fp16,
    grouped_moe_fp16_reference,
    residual_add_routed_pairs,
    residual_add_routed_pairs_reference,
    sum_routed_pairs,
    sum_routed_pairs_reference,
)
from specter_kernels.moe.join_norm import (
    residual_add_rms_norm,
    residual_add_rms_norm_reference,
    residual_add_routed_pairs_rms_norm,
    residual_add_routed_pairs_rms_norm_reference,
)
from specter_kernels.moe.router_topk import router_topk, router_topk_reference
from specter_kernels.norms.residual_norm import (
    add_rms_norm,
    add_rms_norm_reference,
    residual_add,
    residual_add_reference,
)
from specter_kernels.norms.rms_norm import rms_norm, rms_norm_reference
from specter_kernels.quant.gptq_import import import_gptq
from specter_kernels.quant.int4_quantization import (
    SUPPORTED_GROUP_SIZES,
    dequantize_int4,
    pack_int4,
    quantize_int4,
    unpack_int4,
)
from specter_kernels.quant.int4_weight import Int4Weight, concat_gate_up, stack_int4_experts
from specter_kernels.sampling.argmax import argmax_last_dim, argmax_last_dim_reference
from specter_kernels.streaming.experts import StreamedExperts
from specter_kernels.streaming.fills import assign_fill_slots, assign_fill_slots_reference
from specter_kernels.streaming.routing_publish import (
    observe_and_publish,
    observe_and_publish_reference,
)
from specter_kernels.streaming.staging import (
    StagingBuffer,
    stage_streamed,
    stage_streamed_reference,
)

__version__ = "0.1.0"

__all__ = [
    "BACKEND_ENV_VAR",
    "FLOAT_DTYPES",
    "MAX_LATENT",
    "SUPPORTED_GROUP_SIZES",
    "BatchInvariantMode",
    "Int4Weight",
    "MatmulConfig",
    "StagingBuffer",
    "StreamedExperts",
    "__version__",
    "add_rms_norm",
    "add_rms_norm_reference",
    "argmax_last_dim",
    "argmax_last_dim_reference",
    "assign_fill_slots",
    "assign_fill_slots_reference",
    "batch_invariant",
    "concat_gate_up",
    "dequantize_int4",
    "fused_moe_w4a16",
    "fused_moe_w4a16_reference",
    "grouped_moe_fp16",
    "grouped_moe_fp16_reference",
    "import_gptq",
    "invariant_attention",
    "invariant_bmm",
    "invariant_bmm_reference",
    "invariant_layer_norm",
    "invariant_linear",
    "invariant_log_softmax",
    "invariant_mean",
    "invariant_mm",
    "invariant_rms_norm",
    "invariant_row_sum",
    "invariant_row_sum_reference",
    "invariant_softmax",
    "matmul_config",
    "max_aligned_blocks",
    "mla_attention",
    "mla_attention_reference",
    "mla_prologue",
    "mla_prologue_absorb",
    "mla_prologue_absorb_reference",
    "mla_prologue_reference",
    "moe_align_block_size",
    "moe_align_block_size_reference",
    "observe_and_publish",
    "observe_and_publish_reference",
    "pack_int4",
    "quantize_int4",
    "residual_add",
    "residual_add_reference",
    "residual_add_rms_norm",
    "residual_add_rms_norm_reference",
    "residual_add_routed_pairs",
    "residual_add_routed_pairs_reference",
    "residual_add_routed_pairs_rms_norm",
    "residual_add_routed_pairs_rms_norm_reference",
    "rms_norm",
    "rms_norm_reference",
    "rotary_complex",
    "rotary_complex_reference",
    "rotary_half",
    "rotary_half_reference",
    "router_topk",
    "router_topk_reference",
    "select_backend",
    "silu_and_mul",
    "silu_and_mul_reference",
    "stack_int4_experts",
    "stage_streamed",
    "stage_streamed_reference",
    "sum_routed_pairs",
    "sum_routed_pairs_reference",
    "unpack_int4",
]
