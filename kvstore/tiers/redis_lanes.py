"""Lanes: one batch of the Redis tier's puts split over several connections to the same
server(s), so the hashing and sending of its parts run at once.

One connection moves a batch as one pipelined exchange: a single thread hashes every page (its
checksum and MAC) and copies it into its socket, while the server (one thread) waits for the
next bytes. With ``lanes`` > 1 a batch of at least ``2 * MIN_PAGES`` pages is cut into up to ``lanes``
contiguous parts; the calling thread runs the first and a small pool the others, each through
the tier's ordinary single-exchange path (its own pooled connection per server, its own MAC
work), so every guarantee of that path holds per part. LMCache's C++ client does the same with
its worker connections.

Results: the parts' results, concatenated in order. A part whose every server failed (it
raised :class:`TierUnavailable`) gives False for its items and counts one error; only when
every part failed does the batch raise, as one exchange would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from kvstore.errors import TierUnavailable

T = TypeVar("T")
#: The fewest pages a lane carries: below that, a lane's thread hand-off costs more than the
#: overlap gains.
MIN_PAGES = 4


class Lanes:
    """Runs ``fn(*parts)`` over parts of a batch, up to ``lanes`` at once. Thread-safe."""

    def __init__(self, name: str, lanes: int) -> None:
        self.lanes = lanes
        self._pool = (
            ThreadPoolExecutor(lanes - 1, thread_name_prefix=f"kvstore-redis-{name}")
            if lanes > 1 else None
        )

    def run(
        self,
        fn: Callable[..., list[T]],
        n: int,
        seqs: Sequence[Sequence[Any]],
        on_partial: Callable[[], None],
    ) -> list[T]:
        """``fn(*(s[a:b] for s in seqs))`` for each part ``[a, b)`` of ``range(n)``, joined.
        ``on_partial`` is called once when some parts failed and others did not."""
        parts = self._parts(n)
        if self._pool is None or len(parts) == 1:
            return fn(*seqs)
        futures: list[Future[list[T]]] = [
            self._pool.submit(fn, *(s[a:b] for s in seqs)) for a, b in parts[1:]
        ]
        a, b = parts[0]
        results: list[list[T] | None] = []
        failure: TierUnavailable | None = None
        try:
            results.append(fn(*(s[a:b] for s in seqs)))
        except TierUnavailable as exc:
            failure = exc
            results.append(None)
        for future in futures:  # every part is waited for: no buffer is handed back in use
            try:
                results.append(future.result())
            except TierUnavailable as exc:
                failure = failure or exc
                results.append(None)
        if failure is not None:
            if all(r is None for r in results):
                raise failure
            on_partial()
        out: list[T] = []
        for (a, b), got in zip(parts, results):
            out.extend(got if got is not None else [False] * (b - a))  # type: ignore[list-item]
        return out

    def _parts(self, n: int) -> list[tuple[int, int]]:
        k = max(1, min(self.lanes, n // MIN_PAGES))
        bounds = [n * j // k for j in range(k + 1)]
        return [(bounds[j], bounds[j + 1]) for j in range(k)]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


__all__ = ["MIN_PAGES", "Lanes"]
