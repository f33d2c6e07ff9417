"""The engine: Specter's fast decoding path behind one object.

Example:
    >>> from specter_models import Engine, EngineConfig, LoadConfig
    >>> engine = Engine.from_config(EngineConfig(LoadConfig("tiny-deepseek-v2")))
    >>> generation = engine.generate("def f(x):", max_new_tokens=8)
    >>> text = "".join(chunk.text for chunk in generation)
    >>> generation.stats["new_tokens"]
    8
"""

from specter_models.engine.config import (
    BatchConfig,
    CpuExpertsConfig,
    EngineConfig,
    KernelConfig,
    LoadConfig,
    MemoryConfig,
    SpeculationConfig,
)
from specter_models.engine.engine import PLAIN_STREAM_FILLS, Engine
from specter_models.engine.generation import Generation, GenerationChunk
from specter_models.engine.loading import load
from specter_models.engine.plans import DraftDoesNotFitError

__all__ = [
    "PLAIN_STREAM_FILLS",
    "BatchConfig",
    "CpuExpertsConfig",
    "DraftDoesNotFitError",
    "Engine",
    "EngineConfig",
    "Generation",
    "GenerationChunk",
    "KernelConfig",
    "LoadConfig",
    "MemoryConfig",
    "SpeculationConfig",
    "load",
]
