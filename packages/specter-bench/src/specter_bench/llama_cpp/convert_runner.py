"""Runs llama.cpp's ``convert_hf_to_gguf.py`` from a source tree, naming the pre-tokenizer.

    python -m specter_bench.llama_cpp.convert_runner SOURCE PRE CHECKPOINT [converter args]

The converter recognises a BPE tokenizer by the SHA-256 of the ids it gives a probe text and
refuses any it has no hash for; a newly trained tokenizer (``checkpoint_tokenizer``) has
none. Its own remedy is to register the tokenizer's hash in the converter's source by
downloading the tokenizer's repository. Instead, this runner puts the source tree and its
``gguf-py`` on ``sys.path``, has ``TextModel.get_vocab_base_pre`` return ``PRE`` (the
pre-tokenizer llama.cpp implements for it: ``gpt-2`` for a GPT-2 byte-level split) when
``PRE`` is not empty, and runs the unchanged script as ``__main__``. The tokens, merges,
special ids and every tensor are converted by the converter's own code.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str]) -> None:
    """Run the converter of source tree ``argv[0]`` with pre-tokenizer ``argv[1]`` (empty:
    the converter's own recognition) on the arguments ``argv[2:]``."""
    if len(argv) < 3:
        raise SystemExit(
            "usage: python -m specter_bench.llama_cpp.convert_runner SOURCE PRE CHECKPOINT "
            "[converter arguments]"
        )
    source, pre, converter_args = Path(argv[0]), argv[1], argv[2:]
    script = source / "convert_hf_to_gguf.py"
    sys.path[:0] = [str(source / "gguf-py"), str(source)]
    if pre:
        from conversion import base  # the source tree's package

        def named_pre_tokenizer(self, tokenizer) -> str:
            return pre

        base.TextModel.get_vocab_base_pre = named_pre_tokenizer
    sys.argv = [str(script), *converter_args]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
