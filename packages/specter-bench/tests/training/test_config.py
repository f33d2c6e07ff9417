"""Training settings: preset defaults, smoke overrides, range checks; the schedule."""

import pytest

from specter_bench.commands.train import ARCHS
from specter_bench.training import TrainConfig, resolve_settings
from specter_bench.training.architectures import PRESETS
from specter_bench.training.run import prepare_output, reproduce_command
from specter_bench.training.steps import learning_rate_at


def test_the_commands_arch_choices_are_the_presets():
    assert sorted(ARCHS) == sorted(PRESETS)


def test_unset_fields_take_the_presets_defaults_and_smoke_shrinks_the_run():
    settings = resolve_settings(TrainConfig(arch="dsv2-proxy", device="cpu"))
    defaults = PRESETS["dsv2-proxy"].defaults
    assert (settings.batch_size, settings.seq_len, settings.learning_rate) == (
        defaults.batch_size,
        defaults.seq_len,
        defaults.learning_rate,
    )
    assert settings.steps is None
    assert settings.max_files is None
    smoke = resolve_settings(TrainConfig(smoke=True, device="cpu", batch_size=4))
    assert (smoke.steps, smoke.batch_size, smoke.seq_len, smoke.max_files) == (30, 4, 128, 80)
    assert smoke.evals == 3
    assert smoke.max_minutes == 4.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"arch": "gpt-tiny"}, "unknown --arch 'gpt-tiny'"),
        ({"seq_len": 2048}, "--seq-len=2048 exceeds the position limit 1024"),
        ({"batch_size": 0}, "--batch-size=0 must be positive"),
        ({"steps": 0}, "--steps=0 must be at least 1"),
        ({"min_lr_ratio": 1.5}, r"--min-lr-ratio=1.5 must lie in \[0, 1\]"),
        ({"warmup_steps": 10}, "shorter than the 25 timed steps"),
        ({"experts_impl": "fast"}, "--experts-impl 'fast' is not one of"),
    ],
)
def test_out_of_range_settings_are_refused_by_name(change, message):
    with pytest.raises(ValueError, match=message):
        resolve_settings(TrainConfig(device="cpu", **change))


def test_learning_rate_warms_up_linearly_then_decays_to_the_floor():
    settings = resolve_settings(TrainConfig(device="cpu", steps=20, warmup_steps=4))
    peak = settings.learning_rate
    assert learning_rate_at(0, settings, 20) == pytest.approx(peak / 4)
    assert learning_rate_at(3, settings, 20) == pytest.approx(peak)
    assert learning_rate_at(20, settings, 20) == pytest.approx(peak * settings.min_lr_ratio)
    with pytest.raises(RuntimeError, match="step count is not set"):
        learning_rate_at(5, settings, None)


def test_reproduce_command_pins_the_steps_and_leaves_the_output_open():
    argv = ["--arch", "dsv2-tiny", "--out", "/tmp/x", "--steps=9", "--overwrite", "--lr", "1e-3"]
    assert reproduce_command(argv, 120) == (
        "specter train --arch dsv2-tiny --lr 1e-3 --steps 120 --out OUT"
    )


def test_output_folder_refuses_to_mix_runs(tmp_path):
    (tmp_path / "old.txt").write_text("x")
    with pytest.raises(ValueError, match="is not empty; pass --overwrite"):
        prepare_output(tmp_path, overwrite=False)
    prepare_output(tmp_path, overwrite=True)
    assert not any(tmp_path.iterdir())
    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(ValueError, match="is a file; pass a folder path"):
        prepare_output(file, overwrite=False)
