"""llama.cpp's measurements as Specter's ``tpot`` records.

``llama-bench -o json`` prints a JSON array, one object per test with its settings
(``n_prompt``, ``n_gen``, ``n_depth``, ``n_cpu_moe``, ``n_gpu_layers``, ``flash_attn``,
``type_k``, ``model_type``, ``gpu_info``, ``build_commit``, ...) and ``samples_ns``, the
time of each timed repetition. A run of ``-p P -n N -d 0,P -r R`` has four tests; decode is
``tg N`` at depth ``P`` (N single-token steps after a context of ``P``), prefill ``pp P`` at
depth 0, which is also the time to the first token (it ends with the prompt's last logits).
Repetition ``i`` becomes one record with ``run_index = i``: TPOT is its decode time over
``N``.

``llama-speculative-simple`` prints ``encoded P tokens in S seconds``, ``decoded N tokens in
S seconds`` and the counts ``n_drafted`` / ``n_accept``; one run on one prompt becomes one
record, acceptance being ``n_accept / n_drafted`` (per proposed token, as Specter counts it).

System names say placement and weights: ``llama.cpp-gpu-f16`` (every layer on the GPU),
``llama.cpp-cpu-moe-f16`` (``--n-cpu-moe`` > 0), ``llama.cpp-spec-gpu-f16-q4_0`` (target
F16, draft Q4_0).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from specter_bench.bench_record import TpotRecord
from specter_bench.llama_cpp.invocations import BenchSettings

__all__ = [
    "BENCH_PROMPT_SOURCE",
    "SpeculativeResult",
    "bench_records",
    "parse_bench_json",
    "parse_speculative_output",
    "speculative_record",
    "system_name",
]

BENCH_PROMPT_SOURCE = "llama-bench (random token ids)"
_REQUIRED = ("n_prompt", "n_gen", "n_depth", "samples_ns")
_SPEC_PATTERNS = {
    "encoded": re.compile(r"encoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds"),
    "decoded": re.compile(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds"),
    "n_drafted": re.compile(r"n_drafted\s*=\s*(\d+)"),
    "n_accept": re.compile(r"n_accept\s*=\s*(\d+)"),
    "n_draft": re.compile(r"n_draft\s*=\s*(\d+)"),
}


def system_name(weights: str, n_cpu_moe: int, draft: str | None = None) -> str:
    """``llama.cpp-{spec-}{gpu|cpu-moe}-{weights}{-draft}``."""
    placement = "cpu-moe" if n_cpu_moe > 0 else "gpu"
    spec = "spec-" if draft else ""
    return f"llama.cpp-{spec}{placement}-{weights}" + (f"-{draft}" if draft else "")


def parse_bench_json(text: str) -> list[dict[str, Any]]:
    """The tests of ``llama-bench -o json``'s output.

    Raises:
        ValueError: not a JSON array of tests, or a test lacking ``n_prompt``, ``n_gen``,
            ``n_depth`` or ``samples_ns``.
    """
    start = text.find("[")
    try:
        tests = json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"llama-bench printed no JSON array ({exc.msg}); was -o json given?"
        ) from None
    if not isinstance(tests, list) or not all(isinstance(t, dict) for t in tests):
        raise ValueError("llama-bench's output is not a JSON array of tests; was -o json given?")
    for test in tests:
        missing = [k for k in _REQUIRED if k not in test]
        if missing:
            raise ValueError(f"a llama-bench test lacks {missing}: {json.dumps(test)[:200]}")
    return tests


def bench_records(
    tests: list[dict[str, Any]],
    settings: BenchSettings,
    *,
    system: str,
    model: str,
    budget_gb: float | None,
    identity: dict[str, Any],
    driver_peak_gb: float | None = None,
    extra: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One ``tpot`` record per timed repetition of a ``bench_argv`` run.

    Raises:
        ValueError: the tests lack ``tg N`` at depth ``P`` (the decode measured).
    """
    P, N = settings.prompt_tokens, settings.new_tokens
    decode = _test(tests, n_prompt=0, n_gen=N, n_depth=P)
    if decode is None:
        raise ValueError(f"llama-bench's output has no 'tg {N} @ d{P}' test (decode at depth {P})")
    prefill = _test(tests, n_prompt=P, n_gen=0, n_depth=0)
    shallow = _test(tests, n_prompt=0, n_gen=N, n_depth=0)
    deep_prefill = _test(tests, n_prompt=P, n_gen=0, n_depth=P)
    settings_extra = {
        key: decode.get(key)
        for key in (
            "n_cpu_moe",
            "n_gpu_layers",
            "flash_attn",
            "n_threads",
            "n_batch",
            "n_ubatch",
            "type_k",
            "type_v",
            "model_type",
            "model_size",
            "model_n_params",
            "model_filename",
            "backends",
            "gpu_info",
            "cpu_info",
            "build_commit",
            "build_number",
        )
    }
    records = []
    for i, sample in enumerate(decode["samples_ns"]):
        decode_ms = sample / 1e6
        tpot = decode_ms / N
        record = TpotRecord(
            system=system,
            model=model,
            budget_gb=budget_gb,
            prompt_source=BENCH_PROMPT_SOURCE,
            prompt_id=f"random-{P}",
            prompt_tokens=P,
            new_tokens=N,
            tpot_ms=tpot,
            tokens_per_s=1000.0 / tpot,
            prefill_ms=_sample_ms(prefill, i),
            decode_ms=decode_ms,
            note=(
                f"llama.cpp llama-bench: decode of {N} tokens at depth {P} after a prompt of "
                "random ids; peak memory as the driver reports it"
            ),
            identity=identity,
            extra={
                "settings": {**settings_extra, "repetitions": settings.repetitions},
                "tpot_ms_at_depth_0": _per_token(shallow, i, N),
                "prefill_ms_at_depth_prompt": _sample_ms(deep_prefill, i),
                **(extra or {}),
            },
        ).as_dict()
        record["run_index"] = i
        record["driver_peak_gpu_memory_gb"] = driver_peak_gb
        record["ttft_ms"] = record["prefill_ms"]  # pp P: the prompt up to its last logits
        records.append(record)
    return records


@dataclass(frozen=True)
class SpeculativeResult:
    """What ``llama-speculative-simple`` reports of one run.

    Attributes:
        prompt_tokens: tokens encoded (the prompt, BOS included).
        encode_s: seconds encoding the prompt (both models).
        new_tokens: tokens generated.
        decode_s: seconds generating them.
        drafted: tokens the draft proposed.
        accepted: proposals the target accepted.
        draft_max: the most tokens drafted per step.
    """

    prompt_tokens: int
    encode_s: float
    new_tokens: int
    decode_s: float
    drafted: int
    accepted: int
    draft_max: int

    @property
    def acceptance(self) -> float | None:
        """Accepted per proposed token (None when nothing was proposed)."""
        return self.accepted / self.drafted if self.drafted else None


def parse_speculative_output(text: str) -> SpeculativeResult:
    """The figures of one ``llama-speculative-simple`` run from its output.

    Raises:
        ValueError: a figure is missing (the run did not finish); the message names it.
    """
    found: dict[str, tuple[str, ...]] = {}
    for name, pattern in _SPEC_PATTERNS.items():
        matches = pattern.findall(text)
        if not matches:
            raise ValueError(
                f"llama-speculative-simple's output has no {name!r} line; did the run finish?"
            )
        last = matches[-1]
        found[name] = last if isinstance(last, tuple) else (last,)
    return SpeculativeResult(
        prompt_tokens=int(found["encoded"][0]),
        encode_s=float(found["encoded"][1]),
        new_tokens=int(found["decoded"][0]),
        decode_s=float(found["decoded"][1]),
        drafted=int(found["n_drafted"][0]),
        accepted=int(found["n_accept"][0]),
        draft_max=int(found["n_draft"][0]),
    )


def speculative_record(
    result: SpeculativeResult,
    *,
    system: str,
    model: str,
    budget_gb: float | None,
    prompt_source: str,
    prompt_id: str,
    run_index: int,
    identity: dict[str, Any],
    driver_peak_gb: float | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``tpot`` record of one speculative run.

    Raises:
        ValueError: a run that generated nothing.
    """
    if result.new_tokens < 1 or result.decode_s <= 0:
        raise ValueError(f"the speculative run of {prompt_id} generated nothing: {result}")
    decode_ms = result.decode_s * 1e3
    tpot = decode_ms / result.new_tokens
    iterations = result.drafted / result.draft_max if result.draft_max else 0
    record = TpotRecord(
        system=system,
        model=model,
        budget_gb=budget_gb,
        prompt_source=prompt_source,
        prompt_id=prompt_id,
        prompt_tokens=result.prompt_tokens,
        new_tokens=result.new_tokens,
        tpot_ms=tpot,
        tokens_per_s=1000.0 / tpot,
        prefill_ms=result.encode_s * 1e3,
        decode_ms=decode_ms,
        accepted_per_iteration=result.accepted / iterations if iterations else None,
        acceptance_rate=result.acceptance,
        depth=float(result.draft_max),
        note=(
            "llama.cpp llama-speculative-simple: greedy, a draft of every step's full length; "
            "peak memory as the driver reports it"
        ),
        identity=identity,
        extra={"drafted": result.drafted, "accepted": result.accepted, **(extra or {})},
    ).as_dict()
    record["run_index"] = run_index
    record["driver_peak_gpu_memory_gb"] = driver_peak_gb
    return record


def _test(tests: list[dict[str, Any]], **match: int) -> dict[str, Any] | None:
    for test in tests:
        if all(int(test.get(k, -1)) == v for k, v in match.items()):
            return test
    return None


def _sample_ms(test: dict[str, Any] | None, i: int) -> float | None:
    if test is None or i >= len(test["samples_ns"]):
        return None
    return test["samples_ns"][i] / 1e6


def _per_token(test: dict[str, Any] | None, i: int, tokens: int) -> float | None:
    ms = _sample_ms(test, i)
    return None if ms is None else ms / tokens
