"""Where a llama.cpp source tree and build are, and the command lines run in them.

A source tree provides the converter (``convert_hf_to_gguf.py``, its ``conversion``
package and ``gguf-py``); a CUDA build of it provides ``llama-bench``, ``llama-quantize`` and
``llama-speculative-simple`` under ``BUILD/bin`` (with their shared libraries beside them,
put on ``LD_LIBRARY_PATH``). Every command line is built here, from typed settings, and
run by :func:`run_logged`, which keeps the output in a log and returns it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BINARIES",
    "DEFAULT_BUILD",
    "DEFAULT_SOURCE",
    "QUANT_TYPES",
    "BenchSettings",
    "LlamaCppError",
    "LlamaCppTree",
    "SpeculativeSettings",
    "bench_argv",
    "convert_argv",
    "quantize_argv",
    "run_logged",
    "speculative_argv",
]

DEFAULT_SOURCE = ".llama.cpp/src"
DEFAULT_BUILD = ".llama.cpp/build"
BINARIES = ("llama-bench", "llama-quantize", "llama-speculative-simple")
"""The build targets ``specter llama-cpp`` runs."""
CONVERT_TYPES = ("f16", "bf16", "q8_0")
"""Types the converter writes directly (from the checkpoint's FP16 weights)."""
QUANT_TYPES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k_m", "q5_k_m", "q6_k")
"""Types ``llama-quantize`` makes from an F16 GGUF that ``specter llama-cpp`` accepts."""


class LlamaCppError(RuntimeError):
    """A llama.cpp tool is missing or failed (the message says which and what to do)."""


@dataclass(frozen=True)
class LlamaCppTree:
    """A llama.cpp source tree and its build folder.

    Attributes:
        source: the source tree (holds ``convert_hf_to_gguf.py`` and ``gguf-py``).
        build: the CMake build folder (binaries in ``bin``).
    """

    source: Path = Path(DEFAULT_SOURCE)
    build: Path = Path(DEFAULT_BUILD)

    def converter(self) -> Path:
        """``convert_hf_to_gguf.py``.

        Raises:
            LlamaCppError: the source tree is missing or incomplete.
        """
        script = self.source / "convert_hf_to_gguf.py"
        if not script.is_file() or not (self.source / "gguf-py" / "gguf").is_dir():
            raise LlamaCppError(
                f"no llama.cpp source tree at {self.source} (convert_hf_to_gguf.py and "
                "gguf-py/ not found); put one there or pass --source (docs/benchmarking.md, "
                "'llama.cpp on the same weights', says how to carry one)"
            )
        return script

    def binary(self, name: str) -> Path:
        """``BUILD/bin/NAME``.

        Raises:
            LlamaCppError: the binary is not built.
        """
        path = self.build / "bin" / name
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LlamaCppError(
                f"{name} is not built: no executable {path}. Build llama.cpp's targets "
                f"{', '.join(BINARIES)} with CUDA into {self.build} (or pass --build with the "
                "build folder that has them)"
            )
        return path

    def env(self) -> dict[str, str]:
        """The environment for the binaries: their folder first on ``LD_LIBRARY_PATH``."""
        env = dict(os.environ)
        lib = str((self.build / "bin").resolve())
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (lib, env.get("LD_LIBRARY_PATH", "")) if p
        )
        return env


@dataclass(frozen=True)
class BenchSettings:
    """One ``llama-bench`` run: batch-1 decode at the prompt's depth, and the prompt.

    Attributes:
        prompt_tokens: ``P``: the prefill measured (``pp P`` at depth 0) and the depth the
            decode starts at.
        new_tokens: ``N``: tokens decoded one at a time (``tg N`` at depth ``P``).
        repetitions: ``-r``: timed repetitions of each test (after llama-bench's warm-up).
        n_cpu_moe: blocks whose routed experts stay on the CPU (0: all on the GPU).
        n_gpu_layers: ``-ngl`` (99: every layer).
        threads: ``-t`` (None: llama-bench's default, the machine's cores).
        flash_attn: ``-fa`` (``auto``, ``on`` or ``off``).
    """

    prompt_tokens: int = 128
    new_tokens: int = 128
    repetitions: int = 3
    n_cpu_moe: int = 0
    n_gpu_layers: int = 99
    threads: int | None = None
    flash_attn: str = "auto"

    @property
    def n_ctx(self) -> int:
        """The largest context a test needs (``pp P`` at depth ``P``, ``tg N`` at ``P``)."""
        return self.prompt_tokens + max(self.prompt_tokens, self.new_tokens)


@dataclass(frozen=True)
class SpeculativeSettings:
    """One ``llama-speculative-simple`` run on one prompt (greedy).

    Attributes:
        new_tokens: ``-n``: tokens to generate (the run may pass it by up to a draft).
        draft_max: ``--spec-draft-n-max``: most tokens drafted per step.
        n_ctx: ``-c``: the context (prompt plus generation plus a draft, with room).
        n_cpu_moe: the target's blocks whose routed experts stay on the CPU.
        threads: ``-t`` (None: the default).
        flash_attn: ``-fa``.
    """

    new_tokens: int = 128
    draft_max: int = 4
    n_ctx: int = 2048
    n_cpu_moe: int = 0
    threads: int | None = None
    flash_attn: str = "auto"


def convert_argv(
    tree: LlamaCppTree,
    checkpoint: Path,
    outtype: str,
    outfile: Path,
    *,
    pre_tokenizer: str | None,
    python: str | None = None,
) -> list[str]:
    """The converter's command line, through :mod:`~specter_bench.llama_cpp.convert_runner`
    (which names the pre-tokenizer of a tokenizer the converter cannot recognise).

    Raises:
        ValueError: an output type the converter does not write from FP16.
        LlamaCppError: no source tree.
    """
    if outtype not in CONVERT_TYPES:
        raise ValueError(
            f"convert writes {', '.join(CONVERT_TYPES)}, not {outtype!r}; make other types "
            "from the F16 file with `specter llama-cpp quantize`"
        )
    tree.converter()
    return [
        python or sys.executable,
        "-m",
        "specter_bench.llama_cpp.convert_runner",
        str(tree.source),
        pre_tokenizer or "",
        str(checkpoint),
        "--outtype",
        outtype,
        "--outfile",
        str(outfile),
    ]


def quantize_argv(
    tree: LlamaCppTree, source: Path, out: Path, qtype: str, threads: int | None = None
) -> list[str]:
    """``llama-quantize SOURCE OUT TYPE [THREADS]``.

    Raises:
        ValueError: a type not in :data:`QUANT_TYPES`.
        LlamaCppError: ``llama-quantize`` is not built.
    """
    if qtype not in QUANT_TYPES:
        raise ValueError(f"quantize makes {', '.join(QUANT_TYPES)}, not {qtype!r}")
    argv = [str(tree.binary("llama-quantize")), str(source), str(out), qtype.upper()]
    return argv + ([str(threads)] if threads else [])


def bench_argv(tree: LlamaCppTree, gguf: Path, settings: BenchSettings) -> list[str]:
    """``llama-bench`` at batch 1: ``pp P`` and ``tg N`` at depths 0 and ``P``, JSON out.

    Raises:
        ValueError: a count < 1 (a prompt of 0 tokens, no new tokens, no repetitions) or
            ``n_cpu_moe`` < 0.
        LlamaCppError: ``llama-bench`` is not built.
    """
    _positive(
        prompt_tokens=settings.prompt_tokens,
        new_tokens=settings.new_tokens,
        repetitions=settings.repetitions,
    )
    if settings.n_cpu_moe < 0:
        raise ValueError(f"n_cpu_moe must be >= 0, got {settings.n_cpu_moe}")
    argv = [
        str(tree.binary("llama-bench")),
        "-m",
        str(gguf),
        "-p",
        str(settings.prompt_tokens),
        "-n",
        str(settings.new_tokens),
        "-d",
        f"0,{settings.prompt_tokens}",
        "-r",
        str(settings.repetitions),
        "-ngl",
        str(settings.n_gpu_layers),
        "-fa",
        settings.flash_attn,
        "-o",
        "json",
    ]
    return argv + _placement_argv(settings)


def speculative_argv(
    tree: LlamaCppTree,
    gguf: Path,
    draft: Path,
    prompt_file: Path,
    settings: SpeculativeSettings,
) -> list[str]:
    """``llama-speculative-simple``: greedy, the draft model wholly on the GPU, the target's
    first ``n_cpu_moe`` blocks' experts on the CPU, no automatic fitting, the prompt file
    verbatim (llama.cpp's examples turn escape sequences such as a backslash and ``n`` into
    the characters they name unless told not to).

    Raises:
        ValueError: a count < 1.
        LlamaCppError: ``llama-speculative-simple`` is not built.
    """
    _positive(new_tokens=settings.new_tokens, draft_max=settings.draft_max, n_ctx=settings.n_ctx)
    argv = [
        str(tree.binary("llama-speculative-simple")),
        "-m",
        str(gguf),
        "-md",
        str(draft),
        "--spec-type",
        "draft-simple",
        "-f",
        str(prompt_file),
        "-n",
        str(settings.new_tokens),
        "-c",
        str(settings.n_ctx),
        "-ngl",
        "99",
        "-ngld",
        "99",
        "--spec-draft-n-max",
        str(settings.draft_max),
        "--spec-draft-p-min",
        "0",
        "--temp",
        "0",
        "--top-k",
        "1",
        "--ignore-eos",
        "--no-escape",  # the prompt verbatim: no \\n in it becomes a newline
        "-fa",
        settings.flash_attn,
        "--fit",
        "off",
    ]
    return argv + _placement_argv(settings)


def _placement_argv(settings: BenchSettings | SpeculativeSettings) -> list[str]:
    """``--n-cpu-moe N`` (the first N blocks' routed experts on the CPU) and ``-t THREADS``,
    each where set."""
    argv = ["--n-cpu-moe", str(settings.n_cpu_moe)] if settings.n_cpu_moe else []
    return argv + (["-t", str(settings.threads)] if settings.threads else [])


def run_logged(
    argv: Sequence[str],
    log: Path,
    *,
    env: dict[str, str] | None = None,
    echo: bool = True,
    stdout_apart: bool = False,
) -> tuple[str, float]:
    """Run ``argv`` with its output kept in ``log`` (and echoed to stderr).

    Args:
        argv: the command line.
        log: the log file (its folder is made).
        env: the environment (default: this process's).
        echo: copy the output to this process's stderr as it comes.
        stdout_apart: return stdout alone (``llama-bench -o json`` prints its JSON there and
            its log on stderr); otherwise both streams merged.

    Returns:
        ``(output, seconds)``.

    Raises:
        LlamaCppError: the command failed (the message names it, its exit status and the
            log's last lines).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    kept: list[str] = []
    logged: list[str] = []
    with open(log, "w", encoding="utf-8") as handle:
        handle.write("$ " + " ".join(argv) + "\n")
        process = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if stdout_apart else subprocess.STDOUT,
            text=True,
            errors="replace",
            env=env,
        )

        def pump(stream, into: list[str]) -> None:
            for line in stream:
                into.append(line)
                logged.append(line)
                handle.write(line)
                if echo:
                    sys.stderr.write(line)

        side = None
        if stdout_apart:
            side = threading.Thread(target=pump, args=(process.stderr, []), daemon=True)
            side.start()
        pump(process.stdout, kept)
        if side is not None:
            side.join()
        status = process.wait()
    seconds = time.perf_counter() - start
    if status != 0:
        tail = "".join(logged[-15:]).rstrip()
        raise LlamaCppError(
            f"{Path(argv[0]).name} failed (exit status {status}) after {seconds:.0f} s; the "
            f"whole output is in {log}; its end:\n{tail}"
        )
    return "".join(kept), seconds


def _positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
