"""Smoke check: import every Specter package from source and print versions and the GPU."""

import importlib
import platform
import sys

import torch

modules = ["specter_kernels", "specter_cache", "specter_spec", "specter_models", "specter_bench"]
failed = []
print(f"python {platform.python_version()}  torch {torch.__version__}", end="")
for dep in ("triton", "transformers"):
    try:
        print(f"  {dep} {importlib.import_module(dep).__version__}", end="")
    except ImportError:
        print(f"  {dep} missing", end="")
print()
for name in modules:
    try:
        mod = importlib.import_module(name)
        print(f"{name:<16} {mod.__version__:<8} {mod.__file__}")
    except Exception as exc:  # report every failure, then exit non-zero
        failed.append(name)
        print(f"{name:<16} FAILED: {type(exc).__name__}: {exc}")
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    print(
        f"GPU: {props.name}, {props.total_memory / 2**30:.1f} GiB, "
        f"{props.multi_processor_count} SMs, capability {props.major}.{props.minor}"
    )
else:
    print("GPU: none visible to torch (torch.cuda.is_available() is False)")
sys.exit(1 if failed else 0)
