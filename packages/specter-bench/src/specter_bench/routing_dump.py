"""Record a routing trace: the target's and the INT4 draft's routing of whole sequences.

`record_routing_dump` loads a model with every expert resident and the INT4 draft, and for
each prompt of a prompt source greedy-decodes ``max_new_tokens + lookahead`` tokens, then
teacher-forces the whole sequence (prompt and continuation) through the target and the
draft (`specter_models.routing_recorder.record_sequence`). Greedy decoding is exact, so the
target's routing is the one any budget's run of these prompts sees.

The result is a `specter_models.RoutingTrace` (its module docstring describes the file):
`specter policy-replay` studies cache policies on it, and `specter bench --routing replay`
makes the full-size model move and compute its experts (`specter_models.routing_replay`).
The lookahead covers a verification's proposals past the last generated token.

`check_dump` and `split_dump` read the dict of a trace file and of version-1 dumps alike
(``prompt_ids``, ``prompt_lens``, per prompt ``target`` and ``draft`` ``[T, L, k]``; position
``prompt_len - 1`` onwards is the decode).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specter_bench.prompt_sources import PromptSourceConfig
from specter_models.routing_trace import RoutingTrace

__all__ = ["RoutingDumpConfig", "check_dump", "compact", "record_routing_dump", "split_dump"]


@dataclass(frozen=True)
class RoutingDumpConfig:
    """One recording.

    Attributes:
        model: preset name or checkpoint folder.
        prompts: the prompt source (its ``limit``: how many prompts, the first ones).
        max_new_tokens: the new tokens a replay decodes (``specter bench --max-new-tokens``).
        lookahead: tokens recorded past them (the largest depth a replay verifies).
        max_prompt_tokens: prompts are cut to this many tokens (None: whole).
        draft: also record the INT4 draft's routing and agreement.
        device: ``cpu``, ``cuda`` or ``cuda:N``.
    """

    model: str = "deepseek-v2-lite"
    prompts: PromptSourceConfig = field(default_factory=lambda: PromptSourceConfig(limit=24))
    max_new_tokens: int = 128
    lookahead: int = 16
    max_prompt_tokens: int | None = 512
    draft: bool = True
    device: str = "cuda"

    @property
    def continuation(self) -> int:
        """Tokens recorded after each prompt."""
        return self.max_new_tokens + self.lookahead


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
) -> RoutingTrace:
    """Decodes and teacher-forces each prompt (module docstring); returns the trace."""
    from specter_bench.model_loading import load_tokenizer
    from specter_bench.prompt_encoding import encode_prompt
    from specter_bench.prompt_sources import load_prompts
    from specter_models import EngineConfig, LoadConfig, MemoryConfig, SpeculationConfig, load
    from specter_models.routing_recorder import RoutingRecorder, record_sequence

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
    sequences = []
    try:
        for prompt in load_prompts(config.prompts):
            ids = encode_prompt(prompt.text, tokenizer, config.max_prompt_tokens, vocab_size=vocab)
            sequence = record_sequence(
                recorder, lm, ids, config.continuation, prompt_id=prompt.id, source=prompt.source
            )
            sequences.append(sequence)
            agree = "" if sequence.agree is None else f", draft agrees {_agreement(sequence):.2f}"
            log(
                f"{prompt.id}: {len(ids)} + {config.continuation} tokens{agree} "
                f"({time.perf_counter() - t0:.1f} s)"
            )
    finally:
        recorder.remove()
    return RoutingTrace(
        model=config.model,
        moe_layers=lm.cache.num_layers,
        num_experts=lm.cache.num_experts,
        top_k=int(lm.config.num_experts_per_tok),
        sequences=tuple(sequences),
    )


def _agreement(sequence) -> float:
    """The draft's greedy agreement over the decode's positions."""
    return float(sequence.agree[sequence.prompt_len - 1 : -1].double().mean())
