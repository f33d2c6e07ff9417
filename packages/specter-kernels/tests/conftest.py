"""CPU test mode: Triton kernels run under the interpreter on the CPU.

TRITON_INTERPRET must be set before triton is first imported, so it is set here,
at conftest import time, before any test module imports specter_kernels.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
