"""depth_memory: the adaptive depth's costs kept per setup, read back only for that setup."""

import json

import pytest

from specter_models.engine.depth_memory import (
    CACHE_ENV_VAR,
    depth_costs_path,
    read_depth_costs,
    setup_key,
    write_depth_costs,
)

COSTS = {
    "draft": {"1": 1e-3},
    "verify": {"1": 2e-3, "2": 3e-3},
    "overhead": {},
    "steady_plain": None,
}


def test_costs_round_trip_for_their_setup_only(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path))
    setup = setup_key(model="m", budget_gb=24.0, slots_per_layer=45)
    path = depth_costs_path(setup)
    assert path.parent == tmp_path / "depth-costs"
    assert read_depth_costs(path, setup) is None  # nothing kept yet, nothing said
    assert capsys.readouterr().err == ""
    write_depth_costs(path, setup, COSTS)
    assert read_depth_costs(path, setup) == COSTS
    other = setup_key(model="m", budget_gb=24.0, slots_per_layer=44)
    assert depth_costs_path(other) != path
    # the same file asked for another setup (a hash collision, an edited file): not trusted
    assert read_depth_costs(path, other) is None
    assert "written for another setup or schema" in capsys.readouterr().err
    stored = json.loads(path.read_text())
    stored["costs"] = [1, 2]
    path.write_text(json.dumps(stored))
    assert read_depth_costs(path, setup) is None
    assert "not an object" in capsys.readouterr().err


def test_setup_keys_are_ordered_json_scalars():
    assert list(setup_key(b=1, a="x", c=None)) == ["a", "b", "c"]
    with pytest.raises(TypeError, match=r"setup value slots=\[1\] must be a JSON scalar"):
        setup_key(slots=[1])


def test_an_unwritable_folder_is_said_not_raised(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    write_depth_costs(blocker / "depth-costs" / "x.json", setup_key(a=1), COSTS)
    assert "could not keep the depth costs" in capsys.readouterr().err
