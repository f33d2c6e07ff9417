"""The training corpus: Python source files of the running interpreter's standard library.

Every machine with Python has this corpus and no download is needed. The file list is
sorted by relative path and split into training and held-out files by a salted SHA-256
of the relative path, so the split never depends on the training seed and a file never
contributes to both sides. A SHA-256 over the file list and contents identifies the corpus:
two runs on the same interpreter build see byte-identical data.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Directory names whose files are test suites, installed packages or caches, not library code.
EXCLUDED_DIRECTORIES = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
)
# Generated data modules: pydoc's topic dump is prose in one giant string literal.
EXCLUDED_PREFIXES = ("pydoc_data/",)
# Codec tables written by gencodec.py are 256-entry string literals, not code.
GENERATED_CODEC_MARKER = "### Decoding Table"
# Salt of the held-out split; fixed so that every seed is evaluated on the same files.
SPLIT_SALT = b"specter-heldout-v1\0"


@dataclass(frozen=True)
class SourceFile:
    """One corpus file.

    Attributes:
        relative_path: Path inside the standard library, with forward slashes.
        text: The file's text, decoded as UTF-8.
        num_bytes: Size of the file in bytes.
    """

    relative_path: str
    text: str
    num_bytes: int


@dataclass(frozen=True)
class Corpus:
    """The standard-library corpus, split by file.

    Attributes:
        train: Training files, sorted by relative path.
        heldout: Held-out files, sorted by relative path.
        stdlib_root: Where the files were read from.
        python_version: The interpreter that supplied them, e.g. "3.12.3".
        sha256: Digest over every kept file's relative path and bytes, in path order.
        skipped: Relative paths excluded as generated data or unreadable as UTF-8.
    """

    train: tuple[SourceFile, ...]
    heldout: tuple[SourceFile, ...]
    stdlib_root: str
    python_version: str
    sha256: str
    skipped: tuple[str, ...]

    def describe(self) -> dict:
        """Returns the facts a training log records to make the corpus reproducible."""
        return {
            "python_version": self.python_version,
            "python_implementation": platform.python_implementation(),
            "python_build": " ".join(platform.python_build()),
            "stdlib_root": self.stdlib_root,
            "train_files": len(self.train),
            "heldout_files": len(self.heldout),
            "train_bytes": sum(f.num_bytes for f in self.train),
            "heldout_bytes": sum(f.num_bytes for f in self.heldout),
            "skipped_files": len(self.skipped),
            "sha256": self.sha256,
            "heldout_paths": [f.relative_path for f in self.heldout],
        }


def split_fraction(relative_path: str) -> float:
    """Maps a relative path to a fixed pseudo-random number in [0, 1).

    Args:
        relative_path: A corpus file's relative path.

    Returns:
        The first 8 bytes of SHA-256(salt + path) as a fraction of 2**64.
    """
    digest = hashlib.sha256(SPLIT_SALT + relative_path.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _python_files(root: Path) -> list[Path]:
    """Every kept `*.py` under root; excluded folders are pruned, never walked."""
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in EXCLUDED_DIRECTORIES]
        for name in names:
            path = Path(folder) / name
            if name.endswith(".py") and not path.relative_to(root).as_posix().startswith(
                EXCLUDED_PREFIXES
            ):
                found.append(path)
    return found


def load_stdlib_corpus(heldout_fraction: float = 0.02, max_files: int | None = None) -> Corpus:
    """Reads and splits the standard library's Python sources.

    Args:
        heldout_fraction: Share of files (by the path hash) put in the held-out split.
        max_files: Keep only this many files, chosen by the path hash so the subset mixes
            packages (for the quick CPU smoke run). None keeps every file.

    Returns:
        The corpus, with at least one training and one held-out file.

    Raises:
        ValueError: If heldout_fraction is outside (0, 0.5] or max_files is below 2.
        RuntimeError: If the standard library holds too few Python files to split.
    """
    if not 0.0 < heldout_fraction <= 0.5:
        raise ValueError(
            f"heldout_fraction={heldout_fraction} is out of range; expected a share in (0, 0.5], "
            "e.g. 0.02 for 2% of the files."
        )
    if max_files is not None and max_files < 2:
        raise ValueError(f"max_files={max_files} leaves no room for a split; pass at least 2.")
    root = Path(sysconfig.get_paths()["stdlib"]).resolve()
    paths = sorted(_python_files(root), key=lambda p: p.relative_to(root).as_posix())
    if max_files is not None:
        # A differently salted hash: the split's own hash would pick held-out files first.
        by_hash = sorted(
            paths, key=lambda p: split_fraction("subset:" + p.relative_to(root).as_posix())
        )
        keep = set(by_hash[:max_files])
        paths = [p for p in paths if p in keep]

    files: list[SourceFile] = []
    skipped: list[str] = []
    digest = hashlib.sha256()
    for path in paths:
        relative = path.relative_to(root).as_posix()
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            skipped.append(relative)
            continue
        if relative.startswith("encodings/") and GENERATED_CODEC_MARKER in text:
            skipped.append(relative)
            continue
        digest.update(relative.encode() + b"\0" + str(len(raw)).encode() + b"\0" + raw)
        files.append(SourceFile(relative, text, len(raw)))
    if len(files) < 2:
        raise RuntimeError(
            f"found {len(files)} usable Python files under {root}; the corpus needs at least 2. "
            "Run with an interpreter that ships its standard library sources."
        )

    heldout = [f for f in files if split_fraction(f.relative_path) < heldout_fraction]
    if not heldout:  # tiny subsets: hold out the file with the smallest hash
        heldout = [min(files, key=lambda f: split_fraction(f.relative_path))]
    heldout_paths = {f.relative_path for f in heldout}
    train = [f for f in files if f.relative_path not in heldout_paths]
    return Corpus(
        train=tuple(train),
        heldout=tuple(heldout),
        stdlib_root=str(root),
        python_version=platform.python_version(),
        sha256=digest.hexdigest(),
        skipped=tuple(skipped),
    )


if __name__ == "__main__":
    corpus = load_stdlib_corpus()
    summary = corpus.describe()
    summary.pop("heldout_paths")
    print(sys.executable, summary)
