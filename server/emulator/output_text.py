"""Deterministic completions for the emulated engine.

A completion is a run of common English words, each with its leading space, drawn by a random
generator seeded from the prompt's token ids (and the request's `sampling_seed`, when given):
the same prompt always gets the same text, as with greedy decoding, and the text is stable
across runs and machines. Each word is one token whose id is the default tokenizer's id of that
piece, so tokenizing the text gives back exactly the output ids.
"""

from __future__ import annotations

import hashlib
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from inference_auctions.server.engine.builtin_tokenizer import piece_id

__all__ = ["Completion", "completion"]

_VOCABULARY = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there one all we their has been if more when will would "
    "who so no can out up into time other what some only could new these two may first then do "
    "any like my now over such our man me even most made after also did many before must "
    "through back years where much your way well down should because each just those people "
    "how too little state good very make world still own see men work long get here between "
    "both life being under never day same another know while last might us great old year off "
    "come since against go came right used take three light river model cache token prefix "
    "auction order value market price queue batch server answer question reason result"
)
_PIECES = tuple(" " + word for word in _VOCABULARY.split())
_IDS = tuple(piece_id(piece) for piece in _PIECES)


@dataclass(frozen=True, slots=True)
class Completion:
    """The pieces of a completion and their token ids, one piece per token."""

    pieces: tuple[str, ...]
    token_ids: tuple[int, ...]

    def text(self, tokens: int | None = None) -> str:
        """The text of the first `tokens` tokens (all of them by default)."""
        return "".join(self.pieces if tokens is None else self.pieces[:tokens])


def completion(
    input_ids: Sequence[int], length: int, sampling_seed: int | None = None
) -> Completion:
    """The `length`-token completion of the prompt `input_ids`."""
    digest = hashlib.blake2b(array("q", input_ids).tobytes(), digest_size=8)
    if sampling_seed is not None:
        digest.update(sampling_seed.to_bytes(16, "little", signed=True))
    rng = random.Random(int.from_bytes(digest.digest(), "little"))
    picks = [rng.randrange(len(_PIECES)) for _ in range(length)]
    return Completion(tuple(_PIECES[i] for i in picks), tuple(_IDS[i] for i in picks))
