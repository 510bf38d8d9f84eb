"""The default tokenizer: deterministic, offline, and prefix-preserving.

Text is split GPT-2 style into pieces (a word with its leading space, a run of digits, a run of
punctuation, or whitespace) and each piece maps to a stable id: the CRC-32 of its UTF-8 bytes
folded into a 2^20-id vocabulary, never 0. Nothing is downloaded and the mapping never changes
between runs or machines, so two prompts that share a text prefix share a token prefix (up to
the piece where they part), which is all the auction and the emulated cache need. Token counts
are close to a real BPE's for English prose (about one token per word).

It is not the model's tokenizer: with a real SGLang server the server asks SGLang's
`/tokenize` endpoint instead.
"""

from __future__ import annotations

import re
import zlib

VOCABULARY_SIZE = 1 << 20

_PIECES = re.compile(
    r"""'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""", re.UNICODE
)


def pieces(text: str) -> list[str]:
    """Split text into the pieces that become tokens; joining them gives the text back."""
    return _PIECES.findall(text)


def piece_id(piece: str) -> int:
    """The stable id of one piece, in [1, VOCABULARY_SIZE)."""
    return zlib.crc32(piece.encode("utf-8")) % (VOCABULARY_SIZE - 1) + 1


def encode(text: str) -> list[int]:
    """Token ids of `text`."""
    return [piece_id(piece) for piece in pieces(text)]
