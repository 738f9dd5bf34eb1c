"""The stand-in model's tokenizer: text to ids and ids to text, in pure Python (no torch).

Its own module so that the HTTP front (``kernelcamp.serve.front``, ``kernelcamp.serve.openai``) can
spell tokens without importing ``kernelcamp.serve.model`` and with it torch: before, the front imported
torch at its first completion (about 140,000 objects; the first serving window then carried that import
and the full collections it set off, issue 12). ``kernelcamp.serve.model`` no longer holds them.
"""

from __future__ import annotations

import functools
import zlib

__all__ = ["encode", "token_text"]

_CONS, _VOW = "bdfgklmnprstvz", "aeiou"
_SYL = [c + v for c in _CONS for v in _VOW]


def encode(text: str, vocab_size: int) -> list[int]:
    """Whitespace words -> ids in [1, vocab_size) via crc32; ``[1]`` for an empty text."""
    ids = [1 + zlib.crc32(w.encode()) % (vocab_size - 1) for w in text.split()]
    return ids or [1]


@functools.lru_cache(maxsize=1 << 16)
def token_text(token_id: int) -> str:
    """A token's text: a space and a pseudo-word spelled from the id (distinct per id).

    Cached (the vocabulary is small): the server's event loop spells every streamed token, and the
    uncached spelling cost about 20 us per token on a 2-core CPU (benchmarks/sse_path_probe.py's
    cProfile), time the model thread then waits for the GIL (issue 12)."""
    syl = _SYL
    n, parts = int(token_id), []
    while True:
        parts.append(syl[n % len(syl)])
        n //= len(syl)
        if n == 0:
            break
    return " " + "".join(reversed(parts))
