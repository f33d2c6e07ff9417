"""Stand-ins for a llama.cpp source tree and build, for tests on machines without llama.cpp.

The fake converter has the real one's shape where ``specter llama-cpp`` touches it: a
``conversion`` package whose ``TextModel.get_vocab_base_pre`` refuses an unknown tokenizer,
and a script that writes a GGUF (a DeepSeek-V2-Lite header here, recording the pre-tokenizer
it was given; ``none`` for a checkpoint without a tokenizer, such as a tiny preset's). The
fake binaries print what the real ones print: ``llama-bench`` the JSON sample in
``llama_cpp/data``, ``llama-speculative-simple`` its closing report; ``llama-quantize``
writes a DeepSeek-V2-Lite header of the type asked for (Q8_0 or Q4_0). Each binary appends
its command line to ``calls.txt``.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

DATA = Path(__file__).parent / "llama_cpp" / "data"
TESTS = Path(__file__).parent

SPECULATIVE_REPORT = """\
llama_model_loader: loaded meta data with 40 key-value pairs
{prompt}
encoded {encoded:4d} tokens in    0.091 seconds, speed:  593.407 t/s
decoded  130 tokens in    1.300 seconds, speed:  100.000 t/s

n_draft   = 4
n_predict = 130
n_drafted = 160
n_accept  = 90
accept    = 56.250%

draft:


target:

llama_perf_context_print:        load time =    1234.56 ms
"""


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def make_source(root: Path) -> Path:
    """A source tree with the converter's entry points."""
    (root / "gguf-py" / "gguf").mkdir(parents=True)
    (root / "gguf-py" / "gguf" / "__init__.py").write_text("")
    (root / "conversion").mkdir()
    (root / "conversion" / "__init__.py").write_text("")
    (root / "conversion" / "base.py").write_text(
        textwrap.dedent(
            """\
            class TextModel:
                def get_vocab_base_pre(self, tokenizer):
                    raise NotImplementedError("BPE pre-tokenizer was not recognized")
            """
        )
    )
    (root / "convert_hf_to_gguf.py").write_text(
        textwrap.dedent(
            f"""\
            import argparse, sys
            sys.path.insert(0, {str(TESTS)!r})
            from conversion.base import TextModel
            from gguf_samples import deepseek_v2_lite_gguf, write_gguf
            parser = argparse.ArgumentParser()
            parser.add_argument("model")
            parser.add_argument("--outtype")
            parser.add_argument("--outfile")
            args = parser.parse_args()
            from pathlib import Path
            has_tokenizer = (Path(args.model) / "tokenizer.json").is_file()
            pre = TextModel().get_vocab_base_pre(None) if has_tokenizer else "none"
            deepseek_v2_lite_gguf(Path(args.outfile))
            with open(args.outfile, "ab") as f:
                f.write(("pre=" + pre).encode())
            print("INFO:hf-to-gguf:Model successfully exported to", args.outfile)
            """
        )
    )
    return root


def make_build(root: Path) -> Path:
    """A build folder with fake ``llama-bench``, ``llama-quantize`` and
    ``llama-speculative-simple`` in ``bin``."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    log = root / "calls.txt"
    record = f"open({str(log)!r}, 'a').write(' '.join(sys.argv) + '\\n')\n"
    _script(
        bin_dir / "llama-bench",
        f"""\
        import sys
        {record}
        print("load_backend: loaded CUDA backend", file=sys.stderr)
        print(open({str(DATA / "llama_bench_cpu_moe.json")!r}).read())
        """,
    )
    _script(
        bin_dir / "llama-quantize",
        f"""\
        import sys
        from pathlib import Path
        {record}
        sys.path.insert(0, {str(TESTS)!r})
        from gguf_samples import Q4_0, Q8_0, deepseek_v2_lite_gguf
        deepseek_v2_lite_gguf(Path(sys.argv[2]), {{"Q8_0": Q8_0, "Q4_0": Q4_0}}[sys.argv[3]])
        """,
    )
    _script(
        bin_dir / "llama-speculative-simple",
        f"""\
        import sys
        {record}
        prompt = open(sys.argv[sys.argv.index("-f") + 1]).read()
        report = {SPECULATIVE_REPORT!r}
        print(report.format(prompt=prompt, encoded=len(prompt.encode()) // 3))
        """,
    )
    return root


def calls(build: Path) -> list[str]:
    """The command lines the fake binaries ran, in order."""
    log = build / "calls.txt"
    return log.read_text().splitlines() if log.is_file() else []
