"""A reward that lives elsewhere: completions are POSTed to a scoring service, scores come back.

The wire format (what ``rlft serve-reward`` speaks; OpenRLHF-style remote reward models fit it):

    POST <url>   {"prompts": [...], "completions": [...], "columns": {"answer": [...], ...}}
    200          {"rewards": [0.5, 1.0, ...]}        (or just the list)

A ``null`` score means, as a None from a TRL reward function does, that the reward does not apply to
that completion: it adds nothing to its total (see :mod:`rlft.rewards.manager`).

Only transient failures are retried, with exponential backoff: a connection that fails or resets,
a timeout, a 5xx or a 429 (its ``Retry-After`` is honoured). Anything else — a 4xx, a body that is
not JSON, the wrong number of scores, a score that is not a finite number — is a RewardError at
once, naming the URL and what came back: retrying a wrong answer only makes it arrive later.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from rlft.errors import RewardError, RewardOutage

_TRANSIENT_STATUS = {429, 500, 502, 503, 504}


class HttpReward:
    """``f(prompts, completions, **columns) -> list[float | None]`` backed by a scoring service."""

    def __init__(
        self,
        name: str,
        url: str,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        batch_size: int = 64,
        max_concurrency: int = 4,
        headers: dict[str, str] | None = None,
        send_columns: bool = True,
    ):
        self.name, self.url = name, url
        self.retries, self.backoff, self.batch_size = retries, backoff, batch_size
        self.max_concurrency, self.send_columns = max_concurrency, send_columns
        self._http = httpx.Client(
            timeout=timeout, headers=dict(headers or {}), limits=httpx.Limits(max_connections=max_concurrency)
        )
        self.requests = 0  # sent, retries included (for tests and logs)

    @classmethod
    def from_spec(cls, name: str, spec: Any) -> HttpReward:
        return cls(
            name,
            spec.url,
            timeout=spec.timeout,
            retries=spec.retries,
            backoff=spec.backoff,
            batch_size=spec.batch_size,
            max_concurrency=spec.max_concurrency,
            headers=spec.headers,
            send_columns=spec.send_columns,
        )

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **columns) -> list[float | None]:
        n = len(completions)
        starts = list(range(0, n, self.batch_size))
        # The episodes' environment instances (``environments``) are objects of this process, not data.
        cols = {k: v for k, v in columns.items() if k != "environments"} if self.send_columns else {}

        def one(start: int) -> list[float | None]:
            end = min(n, start + self.batch_size)
            body = {
                "prompts": list(prompts[start:end]),
                "completions": list(completions[start:end]),
                "columns": {k: list(v[start:end]) for k, v in cols.items()},
            }
            try:
                return self._post(json.dumps(body, default=str, ensure_ascii=False), end - start, start)
            except RewardOutage as exc:  # the other requests' scores are still good
                return exc

        if len(starts) == 1:
            parts = [one(0)]
        else:
            with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(starts))) as pool:
                parts = list(pool.map(one, starts))
        return _joined(parts, starts, n)

    def _post(self, body: str, expected: int, start: int) -> list[float | None]:
        where = f"reward '{self.name}' ({self.url}, completions {start}..{start + expected - 1})"
        response = post_with_retries(self._http, self.url, body, self.retries, self.backoff, where, self._count)
        return _scores(where, response, expected)

    def _count(self) -> None:
        self.requests += 1

    def close(self) -> None:
        self._http.close()


def _joined(parts: list, starts: list[int], n: int) -> list[float | None]:
    """The scores of every request in order; a :class:`RewardOutage` naming the lost samples (and
    carrying the others' scores) if a request's service stayed down."""
    lost = [p for p in parts if isinstance(p, RewardOutage)]
    if not lost:
        return [x for batch in parts for x in batch]
    scores: list[float | None] = []
    failed: list[int] = []
    for start, end, part in zip(starts, starts[1:] + [n], parts):
        if isinstance(part, RewardOutage):
            scores += [None] * (end - start)
            failed += range(start, end)
        else:
            scores += part
    share = f" ({len(lost)} of {len(parts)} requests lost)" if len(parts) > 1 else ""
    raise RewardOutage(f"{lost[0]}{share}", scores, failed)


def post_with_retries(
    client: httpx.Client, url: str, body: str, retries: int, backoff: float, where: str, on_attempt=lambda: None
) -> httpx.Response:
    """POST the JSON ``body``; retry transient failures (connection errors and timeouts, 5xx, 429) up to
    ``retries`` times with exponential backoff from ``backoff`` seconds; a 2xx response, else RewardError --
    a :class:`RewardOutage` when the service was still unreachable or failing transiently after the retries."""
    delay = backoff
    for attempt in range(retries + 1):
        last = attempt == retries
        on_attempt()
        try:
            response = client.post(url, content=body, headers={"content-type": "application/json"})
        except httpx.TransportError as exc:  # connect error, reset, timeout
            if last:
                raise RewardOutage(f"{where}: {type(exc).__name__} after {attempt + 1} attempts: {exc}") from None
            time.sleep(delay)
            delay *= 2
            continue
        if response.status_code in _TRANSIENT_STATUS and not last:
            time.sleep(max(delay, _retry_after(response)))
            delay *= 2
            continue
        if response.status_code >= 400:
            transient = response.status_code in _TRANSIENT_STATUS
            tries = f" after {attempt + 1} attempts" if transient else ""
            raise (RewardOutage if transient else RewardError)(
                f"{where}: the server answered {response.status_code}{tries}: {response.text[:200]!r}"
            )
        return response
    raise AssertionError("unreachable")


def _retry_after(response: httpx.Response) -> float:
    value = response.headers.get("retry-after", "")
    try:
        return min(float(value), 60.0)
    except ValueError:
        return 0.0


def _scores(where: str, response: httpx.Response, expected: int) -> list[float | None]:
    try:
        data = response.json()
    except ValueError:
        raise RewardError(f"{where}: the answer is not JSON: {response.text[:200]!r}") from None
    scores = data.get("rewards") if isinstance(data, dict) else data
    if not isinstance(scores, list):
        raise RewardError(f'{where}: expected {{"rewards": [...]}} or a list, got {json.dumps(data)[:200]}')
    if len(scores) != expected:
        raise RewardError(f"{where}: {len(scores)} scores for {expected} completions")
    out: list[float | None] = []
    for i, v in enumerate(scores):
        if v is None:  # this reward does not apply to the completion
            out.append(None)
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RewardError(f"{where}: score {i} is {v!r}, not a number")
        if not math.isfinite(v):
            raise RewardError(f"{where}: score {i} is {v}, not a finite number")
        out.append(float(v))
    return out
