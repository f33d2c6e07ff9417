"""Record the target's (and the INT4 draft's) expert routing of whole prompt sequences.

For offline cache-policy studies on the CPU (`specter_bench.policy_replay`):
`record_routing_dump` loads a model with every expert resident and the INT4 draft,
greedy-decodes each of the first ``num_prompts`` HumanEval prompts for ``max_new_tokens``
tokens, then records the target's and the draft's routing of the whole sequence (prompt and
continuation) by teacher forcing (`specter_models.routing_recorder.teacher_forced_pass`).
Greedy decoding is exact, so the target's routing is the one any budget's run of these
prompts sees.

A dump (saved with ``torch.save``) is a dict: ``model``, ``prompt_ids`` (str), ``prompt_lens``
(int), and per prompt ``target`` and ``draft`` (empty without a draft) ``[T, L, k]`` expert
ids, uint8 (int16 past 256 experts); position ``prompt_len - 1`` onwards is the decode (the
input of each decode step).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["RoutingDumpConfig", "check_dump", "compact", "record_routing_dump", "split_dump"]


@dataclass(frozen=True)
class RoutingDumpConfig:
    """One recording.

    Attributes:
        model: preset name or checkpoint folder.
        num_prompts: the first HumanEval prompts.
        max_new_tokens: greedy tokens decoded after each prompt.
        draft: also record the INT4 draft's routing.
        device: ``cpu``, ``cuda`` or ``cuda:N``.
    """

    model: str = "deepseek-v2-lite"
    num_prompts: int = 24
    max_new_tokens: int = 64
    draft: bool = True
    device: str = "cuda"


def compact(routing: torch.Tensor) -> torch.Tensor:
    """Expert ids in uint8 when they fit (every preset's do), else int16."""
    return routing.to(torch.uint8 if int(routing.max()) < 256 else torch.int16)


def check_dump(dump: object) -> None:
    """Checks a dump's keys and shapes.

    Raises:
        ValueError: what is missing or inconsistent, and what a dump holds.
    """
    expected = (
        "a dict with model, prompt_ids, prompt_lens, target and draft (specter record-routing)"
    )
    if not isinstance(dump, dict):
        raise ValueError(f"a routing dump must be {expected}; got {type(dump).__name__}.")
    missing = [k for k in ("prompt_ids", "prompt_lens", "target", "draft") if k not in dump]
    if missing:
        raise ValueError(f"the routing dump lacks {missing}; expected {expected}.")
    targets, lens, drafts = dump["target"], dump["prompt_lens"], dump["draft"]
    if not targets or len(targets) != len(lens) or len(dump["prompt_ids"]) != len(targets):
        raise ValueError(
            f"the routing dump has {len(targets)} target routings, {len(lens)} prompt lengths "
            f"and {len(dump['prompt_ids'])} prompt ids; expected the same count, at least 1."
        )
    if drafts and len(drafts) != len(targets):
        raise ValueError(
            f"the routing dump has {len(drafts)} draft routings for {len(targets)} prompts; "
            "expected one each or none."
        )
    shape = tuple(targets[0].shape[1:])
    for i, (t, n) in enumerate(zip(targets, lens, strict=True)):
        if t.dim() != 3 or tuple(t.shape[1:]) != shape:
            raise ValueError(
                f"prompt {i}'s target routing has shape {tuple(t.shape)}; expected [T, L, k] "
                f"with [L, k] = {list(shape)} like prompt 0's."
            )
        if not 1 <= n < t.shape[0]:
            raise ValueError(
                f"prompt {i} has length {n} but {t.shape[0]} routed positions; expected "
                "1 <= prompt length < positions (at least one decoded token)."
            )
        if drafts and tuple(drafts[i].shape) != tuple(t.shape):
            raise ValueError(
                f"prompt {i}'s draft routing has shape {tuple(drafts[i].shape)}, its target's "
                f"{tuple(t.shape)}; expected the same."
            )


def split_dump(
    dump: dict,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """``(prefills, decodes, draft decodes)`` per prompt: the target's routing before position
    ``prompt_len - 1``, the target's and the draft's from it on (each decode step's input),
    as int64 ``[T, L, k]``; draft decodes are empty without a draft."""
    lens = dump["prompt_lens"]
    targets = [t.long() for t in dump["target"]]
    drafts = [t.long() for t in dump["draft"]]
    prefills = [t[: n - 1] for t, n in zip(targets, lens, strict=True)]
    decodes = [t[n - 1 :] for t, n in zip(targets, lens, strict=True)]
    draft_decodes = [t[n - 1 :] for t, n in zip(drafts, lens, strict=True)] if drafts else []
    return prefills, decodes, draft_decodes


def record_routing_dump(
    config: RoutingDumpConfig, log: Callable[[str], None] = print
) -> dict[str, object]:
    """Decodes and teacher-forces each prompt (module docstring); returns the dump."""
    from specter_bench.engine_systems import ENGINE_SYSTEMS, EngineSystemRunner
    from specter_bench.model_loading import load_tokenizer
    from specter_bench.prompt_encoding import encode_prompt
    from specter_bench.prompt_sources import load_humaneval
    from specter_models import EngineConfig, LoadConfig, MemoryConfig, SpeculationConfig, load
    from specter_models.routing_recorder import RoutingRecorder, teacher_forced_pass

    t0 = time.perf_counter()
    lm = load(
        EngineConfig(
            load=LoadConfig(model=config.model, device=config.device),
            memory=MemoryConfig(max_seq_len=4096),
            speculation=SpeculationConfig(depth="auto" if config.draft else 0),
        ),
        policy="lru",
    )
    log(f"loaded in {time.perf_counter() - t0:.1f} s")
    vocab = lm.model.config.vocab_size
    tokenizer = load_tokenizer(config.model, vocab)
    recorder = RoutingRecorder(lm.model)
    out: dict[str, object] = {"model": config.model, "prompt_ids": [], "prompt_lens": []}
    targets, drafts = [], []
    try:
        for prompt in load_humaneval(config.num_prompts):
            ids = encode_prompt(prompt.text, tokenizer, vocab_size=vocab)
            runner = EngineSystemRunner(lm, ENGINE_SYSTEMS["lru"], 0)
            tokens = runner.generate(ids, config.max_new_tokens).tokens
            sequence = ids + tokens[:-1]
            target = teacher_forced_pass(recorder, lm.target, sequence, 0, lm.reset)
            targets.append(compact(target.routing))
            if lm.draft is not None:
                draft = teacher_forced_pass(recorder, lm.draft, sequence, 0, lm.reset)
                drafts.append(compact(draft.routing))
                del draft
            del target
            out["prompt_ids"].append(prompt.id)  # type: ignore[union-attr]
            out["prompt_lens"].append(len(ids))  # type: ignore[union-attr]
            log(f"{prompt.id} {len(ids)} {len(tokens)} {time.perf_counter() - t0:.1f} s")
    finally:
        recorder.remove()
    out["target"] = targets
    out["draft"] = drafts
    return out
