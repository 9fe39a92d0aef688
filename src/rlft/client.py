"""A Python client for ``rlft serve``.

    from rlft.client import Client
    c = Client("http://127.0.0.1:8000", token=None)       # token: RLFT_TOKEN by default
    job = c.submit(config_path="configs/minimal_example.yaml")
    c.wait(job["job_id"]); print(c.job(job["job_id"])["status"], c.metrics(job["job_id"])[0][-1])

Every method returns the service's JSON; an error answer raises :class:`ServiceError` with the
status, the message and (for a bad config) the dotted-path problem list.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx

TERMINAL = ("success", "failed", "cancelled")


class ServiceError(Exception):
    def __init__(self, status: int, detail: str, problems: list[str] | None = None):
        self.status, self.detail, self.problems = status, detail, list(problems or [])
        lines = [f"{status}: {detail}", *(f"  - {p}" for p in self.problems)]
        super().__init__("\n".join(lines))


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0):
        self.url = (url or os.environ.get("RLFT_URL") or "http://127.0.0.1:8000").rstrip("/")
        token = token if token is not None else os.environ.get("RLFT_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ServiceError(0, f"cannot reach {self.url}: {exc}") from None
        if response.status_code >= 400:
            try:
                body = response.json()
                detail, problems = body.get("detail"), list(body.get("problems") or [])
            except (ValueError, AttributeError):
                detail, problems = response.text, []
            if isinstance(detail, list):  # FastAPI's request validation errors
                problems = [f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail]
                detail = "invalid request"
            raise ServiceError(response.status_code, str(detail), problems)
        return response.json()

    # ------------------------------------------------------------------ jobs

    def health(self) -> dict:
        return self._call("GET", "/api/health")

    def submit(
        self,
        config_path: str | None = None,
        *,
        config: dict | None = None,
        resume_from: str | None = None,
        overrides: list[str] | None = None,
    ) -> dict:
        body = {
            "config_path": config_path,
            "config": config,
            "resume_from": resume_from,
            "overrides": list(overrides or []),
        }
        return self._call("POST", "/api/train", json=body)

    def jobs(self, status: str | None = None) -> list[dict]:
        return self._call("GET", "/api/jobs", params={"status": status} if status else None)["jobs"]

    def job(self, job_id: str) -> dict:
        return self._call("GET", f"/api/jobs/{job_id}")

    def logs(self, job_id: str, stream: str = "stdout", tail: int = 200) -> str:
        return self._call("GET", f"/api/jobs/{job_id}/logs", params={"stream": stream, "tail": tail})["text"]

    def metrics(self, job_id: str, offset: int = 0) -> tuple[list[dict], int]:
        """(records after byte ``offset``, the offset to ask from next). After a resume rewrote the
        file, the records are all of them again (the service says ``reset``)."""
        out = self._call("GET", f"/api/jobs/{job_id}/metrics", params={"offset": offset})
        return out["records"], out["offset"]

    def follow_metrics(self, job_id: str, offset: int = 0) -> Iterator[dict]:
        """Each metrics record as it is written, until the job ends (server-sent events; a dropped
        connection is resumed from the last event's offset)."""
        while True:
            try:
                with self._http.stream(
                    "GET", f"/api/jobs/{job_id}/metrics/stream", params={"offset": offset}, timeout=None
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        self._call("GET", f"/api/jobs/{job_id}")  # raises the service's error
                    event, data = None, None
                    for line in response.iter_lines():
                        if line.startswith("id: "):
                            offset = int(line[4:])
                        elif line.startswith("event: "):
                            event = line[7:]
                        elif line.startswith("data: "):
                            data = json.loads(line[6:])
                        elif not line and event:
                            if event == "end":
                                return
                            if event == "metrics":
                                yield from data
                            event = None
            except httpx.TransportError:
                time.sleep(1.0)

    def samples(self, job_id: str, steps: int = 3) -> list[dict]:
        return self._call("GET", f"/api/jobs/{job_id}/samples", params={"steps": steps})["groups"]

    def evaluations(self, job_id: str) -> list[dict]:
        return self._call("GET", f"/api/jobs/{job_id}/eval")["results"]

    def cancel(self, job_id: str) -> dict:
        return self._call("POST", f"/api/jobs/{job_id}/cancel")

    def resume(self, job_id: str, overrides: list[str] | None = None) -> dict:
        return self._call("POST", f"/api/jobs/{job_id}/resume", json={"overrides": list(overrides or [])})

    def wait(self, job_id: str, timeout: float | None = None, poll: float = 1.0) -> dict:
        """Poll until the job reaches a terminal status (TimeoutError after ``timeout`` seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["status"] in TERMINAL:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout} s")
            time.sleep(poll)
