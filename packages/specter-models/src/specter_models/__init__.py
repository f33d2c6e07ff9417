"""specter-models.

DeepSeek-V2, Qwen1.5-MoE and Phi-3.5-MoE on transformers' own model classes with offloaded
FP16 experts and a shared-weight INT4 draft. ``Engine.from_config(EngineConfig(...))`` sets
up the whole fast path and ``Engine.generate`` streams completions; ``load`` gives the
``SpecterModel`` of a config alone, whose ``draft``, ``target`` and ``prefetcher`` go to
specter-spec's ``SpecController``.
"""

from specter_models.architecture import SUPPORTED_MODEL_TYPES, Architecture, architecture_for
from specter_models.cpu_experts import CpuExpertExecutor, CpuKernelUnavailableError
from specter_models.engine import (
    BatchConfig,
    CpuExpertsConfig,
    DraftDoesNotFitError,
    Engine,
    EngineConfig,
    Generation,
    GenerationChunk,
    KernelConfig,
    LoadConfig,
    MemoryConfig,
    SpeculationConfig,
    load,
)
from specter_models.experts_runtime import ExpertsMode, ExpertsRuntime
from specter_models.hot_experts import (
    HotExpertChoice,
    PlainReplay,
    auto_pruned_per_layer,
    choose_hot_experts,
    coldest_experts,
    hottest_experts,
    replay_plain_decoding,
    resolve_pruned_per_layer,
    routing_counts,
)
from specter_models.kv_cache import StaticKVCache
from specter_models.memory_meter import MemoryPeaks
from specter_models.memory_plan import MemoryBudgetError, MemoryPlan, plan_memory
from specter_models.plain_hot_set import choose_plain_hot_experts
from specter_models.presets import (
    DEMO_MODEL,
    FULL_SIZE_PRESETS,
    PRESETS,
    TINY_PRESETS,
    Preset,
    demo_model_path,
    get_preset,
    preset_config,
)
from specter_models.reference_model import build_reference_model, reference_model_from
from specter_models.routing_replay import RoutingReplay, RoutingReplayConfig, replay_routing
from specter_models.routing_trace import RoutingTrace, TracedSequence
from specter_models.row_truncation import RowTruncation, choose_cutoff
from specter_models.shared_overlap import SharedExpertOverlap
from specter_models.spec_adapters import DraftModel, SharedKV, TargetModel
from specter_models.specter_experts import SpecterExperts
from specter_models.specter_model import MemoryReport, SpecterModel
from specter_models.streamed_misses import DEFAULT_STREAM_FILLS, MISS_PATHS
from specter_models.tokenizers import ByteTokenizer

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_STREAM_FILLS",
    "DEMO_MODEL",
    "FULL_SIZE_PRESETS",
    "MISS_PATHS",
    "PRESETS",
    "SUPPORTED_MODEL_TYPES",
    "TINY_PRESETS",
    "Architecture",
    "BatchConfig",
    "ByteTokenizer",
    "CpuExpertExecutor",
    "CpuExpertsConfig",
    "CpuKernelUnavailableError",
    "DraftDoesNotFitError",
    "DraftModel",
    "Engine",
    "EngineConfig",
    "ExpertsMode",
    "ExpertsRuntime",
    "Generation",
    "GenerationChunk",
    "HotExpertChoice",
    "KernelConfig",
    "LoadConfig",
    "MemoryBudgetError",
    "MemoryConfig",
    "MemoryPeaks",
    "MemoryPlan",
    "MemoryReport",
    "PlainReplay",
    "Preset",
    "RoutingReplay",
    "RoutingReplayConfig",
    "RoutingTrace",
    "RowTruncation",
    "SharedExpertOverlap",
    "SharedKV",
    "SpecterExperts",
    "SpecterModel",
    "SpeculationConfig",
    "StaticKVCache",
    "TargetModel",
    "TracedSequence",
    "__version__",
    "architecture_for",
    "auto_pruned_per_layer",
    "build_reference_model",
    "choose_cutoff",
    "choose_hot_experts",
    "choose_plain_hot_experts",
    "coldest_experts",
    "demo_model_path",
    "get_preset",
    "hottest_experts",
    "load",
    "plan_memory",
    "preset_config",
    "reference_model_from",
    "replay_plain_decoding",
    "replay_routing",
    "resolve_pruned_per_layer",
    "routing_counts",
]
