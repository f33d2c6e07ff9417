"""Training the built-in demo model and topology proxies of the benchmark models.

    from specter_bench.training import TrainConfig, train
    train(TrainConfig(arch="dsv2-tiny", smoke=True), "/tmp/specter-smoke")

``specter train`` is the command line over `train`; docs/training.md describes a run.
"""

from specter_bench.training.config import RunSettings, TrainConfig, resolve_settings
from specter_bench.training.run import train

__all__ = ["RunSettings", "TrainConfig", "resolve_settings", "train"]
