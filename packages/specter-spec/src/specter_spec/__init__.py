"""specter-spec.

Speculative decoding controller with exact greedy and sampled acceptance, KV rollback
and adaptive depth, for any draft/target pair. Needs only torch: transformers models
plug in through :class:`HFCausalLM`, which never imports transformers itself.
"""

from specter_spec.acceptance import (
    AcceptanceResult,
    acceptance_probability,
    greedy_accept,
    rejection_sample,
    residual_distribution,
)
from specter_spec.batch_controller import BatchedSpecController
from specter_spec.batch_model import BatchSpecModel, SlotModels, SlotRows
from specter_spec.batch_sequence import BatchEvent, BatchFullError, BatchSequence, BatchStepRecord
from specter_spec.controller import SpecController
from specter_spec.depth import (
    AdaptiveDepth,
    AdaptiveDepthConfig,
    DepthPolicy,
    FixedDepth,
    expected_committed,
)
from specter_spec.depth_profiler import DepthProfile, profile_depth
from specter_spec.hf_causal_lm import HFCausalLM
from specter_spec.phase_clock import PhaseClock
from specter_spec.recorded_acceptance import AcceptanceOverride, RecordedAcceptance
from specter_spec.sampling import (
    NonFiniteLogitsError,
    SamplingConfig,
    check_finite_logits,
    sampling_probs,
)
from specter_spec.spec_model import SpecModel
from specter_spec.speculation_observer import SpeculationObserver
from specter_spec.statistics import GenerationResult, GenerationStats, IterationStats
from specter_spec.token_stream import TokenStream

__version__ = "0.1.0"

__all__ = [
    "AcceptanceOverride",
    "AcceptanceResult",
    "AdaptiveDepth",
    "AdaptiveDepthConfig",
    "BatchEvent",
    "BatchFullError",
    "BatchSequence",
    "BatchSpecModel",
    "BatchStepRecord",
    "BatchedSpecController",
    "DepthPolicy",
    "DepthProfile",
    "FixedDepth",
    "GenerationResult",
    "GenerationStats",
    "HFCausalLM",
    "IterationStats",
    "NonFiniteLogitsError",
    "PhaseClock",
    "RecordedAcceptance",
    "SamplingConfig",
    "SlotModels",
    "SlotRows",
    "SpecController",
    "SpecModel",
    "SpeculationObserver",
    "TokenStream",
    "__version__",
    "acceptance_probability",
    "check_finite_logits",
    "expected_committed",
    "greedy_accept",
    "profile_depth",
    "rejection_sample",
    "residual_distribution",
    "sampling_probs",
]
