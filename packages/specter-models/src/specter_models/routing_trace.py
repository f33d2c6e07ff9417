"""A recorded routing trace: what a routing replay needs of each recorded sequence.

``specter record-routing`` greedy-decodes prompts on a (trained) model, then teacher-forces
each whole sequence through the target and the INT4 draft. A trace keeps, per sequence:

* ``tokens [N]``: the prompt's ids, then the target's greedy continuation;
* ``prompt_len``: ``P``; position ``P - 1`` onwards is the decode (each step's input);
* ``target [N, L, k]`` and ``draft [N, L, k]``: each position's experts per MoE layer
  (uint8, int16 past 256 experts), the target's and the draft's;
* ``agree [N]`` bool: whether the draft's greedy next token after position ``p`` equals
  the target's, both teacher-forced on ``tokens`` (with greedy decoding this decides
  acceptance exactly; specter-spec's ``RecordedAcceptance``).

On disk (``torch.save``) a trace is a dict: ``format`` (:data:`TRACE_FORMAT`), ``version``
(:data:`TRACE_VERSION`), ``model``, ``topology`` (``moe_layers``, ``num_experts``,
``top_k``), and per sequence lists ``prompt_ids`` (str), ``prompt_sources``,
``prompt_lens``, ``tokens``, ``target``, ``draft`` and ``agree`` (the last two empty
without a draft). Dumps of version 1 (no ``format`` key: routing only, one position fewer)
still serve ``specter policy-replay``, which reads ``prompt_ids``, ``prompt_lens``,
``target`` and ``draft`` only; replaying one is refused with a clear error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["TRACE_FORMAT", "TRACE_VERSION", "RoutingTrace", "TracedSequence", "compact_ids"]

TRACE_FORMAT = "specter-routing-trace"
TRACE_VERSION = 2


def compact_ids(routing: torch.Tensor) -> torch.Tensor:
    """Expert ids in uint8 when they fit (every preset's do), else int16."""
    return routing.to(torch.uint8 if int(routing.max()) < 256 else torch.int16)


@dataclass(frozen=True)
class TracedSequence:
    """One recorded sequence (module docstring).

    Attributes:
        prompt_id: the prompt's id in its source.
        source: the prompt source (``humaneval``, ``wikitext2``, ...).
        tokens: ``[N]`` int64.
        prompt_len: ``P``, ``1 <= P < N``.
        target: ``[N, L, k]`` the target's expert ids.
        draft: ``[N, L, k]`` the draft's, or None (recorded without a draft).
        agree: ``[N]`` bool, or None without a draft.
    """

    prompt_id: str
    source: str
    tokens: torch.Tensor
    prompt_len: int
    target: torch.Tensor
    draft: torch.Tensor | None
    agree: torch.Tensor | None

    @property
    def length(self) -> int:
        """``N``: tokens (and routed positions) recorded."""
        return int(self.tokens.shape[0])

    @property
    def continuation(self) -> int:
        """Tokens recorded after the prompt."""
        return self.length - self.prompt_len


def _fail(where: str, problem: str) -> None:
    raise ValueError(
        f"{where}: {problem}; a routing trace is written by `specter record-routing` "
        "(see docs/benchmarking.md, 'Replayed trained routing')."
    )


@dataclass(frozen=True)
class RoutingTrace:
    """The recorded sequences of one model (module docstring).

    Attributes:
        model: the recorded model (preset name or checkpoint folder).
        moe_layers: ``L``; num_experts: ``E``; top_k: ``k``.
        sequences: the recorded sequences, in recording order.
        path: the file it was read from, or None.
    """

    model: str
    moe_layers: int
    num_experts: int
    top_k: int
    sequences: tuple[TracedSequence, ...]
    path: Path | None = None

    def __post_init__(self) -> None:
        where = f"routing trace {self.path or self.model}"
        if not self.sequences:
            _fail(where, "it holds no sequence")
        shape = (self.moe_layers, self.num_experts, self.top_k)
        for i, s in enumerate(self.sequences):
            n = s.length
            if s.tokens.dim() != 1 or not 1 <= s.prompt_len < n:
                _fail(where, f"sequence {i} has {n} tokens and prompt length {s.prompt_len}")
            for name, ids in (("target", s.target), ("draft", s.draft)):
                if ids is not None and tuple(ids.shape) != (n, shape[0], shape[2]):
                    _fail(
                        where,
                        f"sequence {i}'s {name} routing has shape {tuple(ids.shape)}; expected "
                        f"[{n}, {shape[0]}, {shape[2]}] (tokens, MoE layers, top-k)",
                    )
                if ids is not None and ids.numel() and int(ids.max()) >= self.num_experts:
                    _fail(where, f"sequence {i} routes to expert {int(ids.max())} of {shape[1]}")
            if (s.draft is None) != (s.agree is None):
                _fail(where, f"sequence {i} has draft routing without agreement flags or back")
            if s.agree is not None and (s.agree.shape != (n,) or s.agree.dtype != torch.bool):
                _fail(where, f"sequence {i}'s agreement flags are not bool [{n}]")

    @property
    def has_draft(self) -> bool:
        """Whether every sequence holds the draft's routing and the agreement flags."""
        return all(s.draft is not None for s in self.sequences)

    @property
    def name(self) -> str:
        """The trace file's name (the model's name for a trace not read from a file)."""
        return self.path.name if self.path is not None else Path(self.model).name

    def check_topology(self, moe_layers: int, num_experts: int, top_k: int, what: str) -> None:
        """Raise a clear ``ValueError`` when ``what`` has another topology than the trace's.

        Raises:
            ValueError: naming both topologies.
        """
        ours = (self.moe_layers, self.num_experts, self.top_k)
        if ours != (moe_layers, num_experts, top_k):
            raise ValueError(
                f"routing trace {self.name} was recorded on {self.model} with {ours[0]} MoE "
                f"layers, {ours[1]} experts and top-{ours[2]}; {what} has {moe_layers} MoE "
                f"layers, {num_experts} experts and top-{top_k}. Replay a trace of a model with "
                "the same topology (dsv2-proxy for deepseek-v2-lite, qwen-proxy for "
                "qwen1.5-moe, phi-proxy for phi-3.5-moe)."
            )

    def check_length(self, index: int, max_new_tokens: int) -> TracedSequence:
        """Sequence ``index``, checked to hold its prompt and ``max_new_tokens`` more tokens.

        Raises:
            ValueError: no such sequence, or a continuation shorter than ``max_new_tokens``.
        """
        if not 0 <= index < len(self.sequences):
            raise ValueError(
                f"routing trace {self.name} holds {len(self.sequences)} sequences; sequence "
                f"{index} was asked for. Record more prompts or replay fewer."
            )
        s = self.sequences[index]
        if s.continuation < max_new_tokens:
            raise ValueError(
                f"routing trace {self.name}: sequence {index} ({s.prompt_id}) holds "
                f"{s.prompt_len} prompt tokens and {s.continuation} continuation tokens; "
                f"decoding {max_new_tokens} new tokens needs {max_new_tokens}. Record it with "
                f"`specter record-routing --max-new-tokens {max_new_tokens}` or more."
            )
        return s

    def as_dump(self) -> dict[str, object]:
        """The ``torch.save`` dict of the module docstring."""
        seqs = self.sequences
        return {
            "format": TRACE_FORMAT,
            "version": TRACE_VERSION,
            "model": self.model,
            "topology": {
                "moe_layers": self.moe_layers,
                "num_experts": self.num_experts,
                "top_k": self.top_k,
            },
            "prompt_ids": [s.prompt_id for s in seqs],
            "prompt_sources": [s.source for s in seqs],
            "prompt_lens": [s.prompt_len for s in seqs],
            "tokens": [s.tokens for s in seqs],
            "target": [s.target for s in seqs],
            "draft": [s.draft for s in seqs] if self.has_draft else [],
            "agree": [s.agree for s in seqs] if self.has_draft else [],
        }

    @classmethod
    def from_dump(cls, dump: object, path: Path | None = None) -> RoutingTrace:
        """Read a dump (the dict ``torch.load`` gives).

        Raises:
            ValueError: not a dict, a version-1 dump or another format, or inconsistent
                contents.
        """
        where = f"routing trace {path}" if path is not None else "routing trace"
        if not isinstance(dump, dict):
            _fail(where, f"expected a dict, got {type(dump).__name__}")
        if dump.get("format") != TRACE_FORMAT:
            if "target" in dump and "prompt_lens" in dump:
                _fail(
                    where,
                    "it is a version-1 routing dump (routing only, no token ids or agreement "
                    "flags), which `specter policy-replay` reads but a replay cannot; record it "
                    "again with this version",
                )
            _fail(where, f"its format is {dump.get('format')!r}, not {TRACE_FORMAT!r}")
        if dump.get("version") != TRACE_VERSION:
            _fail(where, f"version {dump.get('version')!r}; this Specter reads {TRACE_VERSION}")
        keys = ("model", "topology", "tokens", "draft", "agree", "prompt_ids", "prompt_sources")
        missing = [key for key in (*keys, "prompt_lens", "target") if key not in dump]
        if missing:
            _fail(where, f"it lacks {missing}")
        topology = dump["topology"]
        drafts, agree = dump["draft"], dump["agree"]
        count = len(dump["tokens"])
        lists = ("prompt_ids", "prompt_sources", "prompt_lens", "target")
        if (
            any(len(dump[key]) != count for key in lists)
            or len(drafts) not in (0, count)
            or len(agree) != len(drafts)
        ):
            _fail(where, f"its per-sequence lists have different lengths ({count} token lists)")
        sequences = tuple(
            TracedSequence(
                prompt_id=str(dump["prompt_ids"][i]),
                source=str(dump["prompt_sources"][i]),
                tokens=dump["tokens"][i].long(),
                prompt_len=int(dump["prompt_lens"][i]),
                target=dump["target"][i],
                draft=drafts[i] if drafts else None,
                agree=agree[i] if drafts else None,
            )
            for i in range(count)
        )
        return cls(
            model=str(dump["model"]),
            moe_layers=int(topology["moe_layers"]),
            num_experts=int(topology["num_experts"]),
            top_k=int(topology["top_k"]),
            sequences=sequences,
            path=path,
        )

    def save(self, path: str | Path) -> None:
        """Write the trace with ``torch.save``."""
        torch.save(self.as_dump(), Path(path))

    @classmethod
    def load(cls, path: str | Path) -> RoutingTrace:
        """Read a trace file.

        Raises:
            FileNotFoundError: no such file.
            ValueError: not a routing trace of this version.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"routing trace {path} does not exist; write one with `specter record-routing`."
            )
        return cls.from_dump(torch.load(path, weights_only=True), path)

    def extended(self, more: Sequence[TracedSequence]) -> RoutingTrace:
        """This trace with ``more`` sequences after its own (same model and topology)."""
        return RoutingTrace(
            self.model, self.moe_layers, self.num_experts, self.top_k,
            (*self.sequences, *more), self.path,
        )  # fmt: skip
