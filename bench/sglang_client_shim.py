"""Run SGLang's own benchmark client, unchanged, on a machine without a GPU or a network.

Two subcommands, both run in the separate SGLang virtualenv made by
``bench/setup_sglang_reference.sh`` (never in the project's own; nothing here imports the
project)::

    python bench/sglang_client_shim.py tokenizer DIR
        Save an offline word-level tokenizer in DIR, loadable with
        ``AutoTokenizer.from_pretrained(DIR)``, for ``bench_serving --tokenizer DIR``.

    python bench/sglang_client_shim.py bench-serving [bench_serving arguments...]
        Run ``python -m sglang.bench_serving`` with the given arguments, after installing an
        import stub for ``torchvision``.

Why the stub: ``sglang.bench_serving`` imports ``sglang.srt.utils``, whose import chain reaches
SGLang's multimodal config modules, which ``import torchvision.transforms``. PyPI's torchvision
cannot load beside the CPU build of torch, and the benchmark client never calls it, so an
empty module is enough. Only real import statements get the stub: transformers probes
``importlib.util.find_spec("torchvision")`` to decide whether to use torchvision and must keep
seeing that it is absent. The benchmark module itself runs as ``__main__`` through ``runpy``,
exactly as ``python -m`` would run it.
"""

from __future__ import annotations

import argparse
import importlib
import runpy
import sys
from pathlib import Path

try:  # run as a module of the repository (type checks, tests)
    from bench import torchvision_stub
except ImportError:  # run as a script in SGLang's virtualenv, where bench/ is on sys.path
    import torchvision_stub  # type: ignore[no-redef, import-not-found]

# Vocabulary of the offline tokenizer: short made-up words (no network, no model download).
VOCAB_SIZE = 8_000
UNK = "[UNK]"


def _word(i: int) -> str:
    """A pronounceable lowercase word for index ``i`` (distinct for distinct ``i``)."""
    consonants = "bdfgklmnprstvz"
    vowels = "aeiou"
    letters = []
    n = i
    while True:
        letters.append(consonants[n % len(consonants)])
        n //= len(consonants)
        letters.append(vowels[n % len(vowels)])
        n //= len(vowels)
        if n == 0:
            break
        n -= 1
    return "".join(letters)


def build_tokenizer(directory: Path) -> None:
    """Save a word-level tokenizer (whitespace pre-tokenizer, ``VOCAB_SIZE`` words)."""
    # Imported by name: they live only in the SGLang virtualenv.
    tk = importlib.import_module("tokenizers")
    fast = importlib.import_module("transformers").PreTrainedTokenizerFast

    words = [_word(i) for i in range(VOCAB_SIZE - 1)]
    assert len(set(words)) == len(words)
    vocab = {UNK: 0} | {w: i + 1 for i, w in enumerate(words)}
    core = tk.Tokenizer(tk.models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = tk.pre_tokenizers.WhitespaceSplit()
    core.decoder = tk.decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tokenizer = fast(tokenizer_object=core, unk_token=UNK)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(directory))
    # Round trip: what bench_serving does with it (decode random ids, encode the text back).
    ids = list(range(1, 50))
    text = tokenizer.decode(ids)
    if tokenizer.encode(text, add_special_tokens=False) != ids:
        raise SystemExit(f"tokenizer in {directory} does not round-trip")
    print(f"tokenizer: {len(vocab)} words in {directory}")


def run_bench_serving(args: list[str]) -> None:
    torchvision_stub.install()
    sys.argv = ["sglang.bench_serving", *args]
    runpy.run_module("sglang.bench_serving", run_name="__main__", alter_sys=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tok = sub.add_parser("tokenizer", help="save an offline word-level tokenizer in DIR")
    tok.add_argument("directory", type=Path)
    sub.add_parser(
        "bench-serving",
        help="run sglang.bench_serving with the remaining arguments",
        add_help=False,
    )
    if len(sys.argv) > 1 and sys.argv[1] == "bench-serving":
        run_bench_serving(sys.argv[2:])
        return
    args = parser.parse_args()
    build_tokenizer(args.directory)


if __name__ == "__main__":
    main()
