"""The host's CPU model and measured memory bandwidth."""

from specter_bench.host_facts import cpu_model, host_facts, memory_bandwidth_gb_per_s


def test_the_cpu_model_comes_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: X\nmodel name\t: Example CPU 9000\n")
    assert cpu_model(info) == "Example CPU 9000"
    assert cpu_model(tmp_path / "missing")  # the platform's name, or "unknown"


def test_the_bandwidth_is_measured_and_reported():
    assert memory_bandwidth_gb_per_s(megabytes=8, repeats=1) > 0
    facts = host_facts(measure_bandwidth=False)
    assert set(facts) == {"cpu", "cores", "torch_threads"}
