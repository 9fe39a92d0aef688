"""Questions a model can only answer by searching: a BM25 ``search(query)`` tool over a corpus of
facts about entities that do not exist (:mod:`rlft.envs.builtin.search_corpus` makes the corpus and
the questions).
"""

from __future__ import annotations

import json
import threading
from functools import cache
from pathlib import Path
from typing import Any

# Imported here, not lazily: the environment workers' fork server preloads this module, so 64
# episodes a step share one import instead of paying for it each (the registry stays light: it
# never imports this module).
import bm25s

from rlft.envs.builtin import demo_messages

# the corpus and rows, part of a built-in environment's module interface (rlft.envs.builtin)
from rlft.envs.builtin.search_corpus import demo_rows, make_corpus, make_rows  # noqa: F401
from rlft.errors import EnvironmentFailure

TOP_K = 2
MAX_QUERY_CHARS = 200


# path -> (mtime_ns, retriever, documents): 32 episodes a step share one index per worker process.
_INDEXES: dict[str, tuple[int, Any, list[dict]]] = {}
_LOCK = threading.Lock()


def _load(path: Path) -> list[dict]:
    docs = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            docs.append({"id": str(doc["id"]), "title": str(doc["title"]), "text": str(doc["text"])})
        except (ValueError, KeyError, TypeError) as exc:
            raise EnvironmentFailure(
                f"search docs {path}, line {number}: expected a JSON object with id, title and text ({exc})"
            ) from None
    if not docs:
        raise EnvironmentFailure(f"search docs {path} has no documents")
    return docs


def _index(docs_path: str) -> tuple[Any, list[dict]]:
    path = Path(docs_path).expanduser().resolve()
    try:
        mtime = path.stat().st_mtime_ns
    except OSError as exc:
        raise EnvironmentFailure(f"search docs file {docs_path} cannot be read ({exc.strerror})") from None
    with _LOCK:
        hit = _INDEXES.get(str(path))
        if hit is None or hit[0] != mtime:
            docs = _load(path)
            retriever = bm25s.BM25()
            retriever.index(
                bm25s.tokenize([f"{d['title']} {d['text']}" for d in docs], stopwords="en", show_progress=False),
                show_progress=False,
            )
            hit = _INDEXES[str(path)] = (mtime, retriever, docs)
    return hit[1], hit[2]


class SearchEnv:
    """One question; the tool searches the corpus in ``docs`` (a JSONL file of id/title/text)."""

    def __init__(self, docs: str):
        self.retriever, self.docs = _index(docs)
        self.searches = 0

    def reset(self, **row: object) -> str | None:
        self.searches = 0
        return None

    def search(self, query: str) -> str:
        """Search the document collection and return the best matching documents.

        Args:
            query: A few keywords, e.g. the name of what you are looking for and the fact you need.
        """

        self.searches += 1
        if not isinstance(query, str) or not query.strip():
            return "error: give a query of a few keywords"
        if len(query) > MAX_QUERY_CHARS:
            return f"error: query too long (over {MAX_QUERY_CHARS} characters)"
        tokens = bm25s.tokenize([query], stopwords="en", show_progress=False, return_ids=False)
        if not tokens[0]:  # stopwords only: nothing to score (bm25s 0.2.0 raises IndexError on it)
            return "No documents match that query."
        found, scores = self.retriever.retrieve(tokens, k=min(TOP_K, len(self.docs)), show_progress=False)
        hits = [self.docs[int(i)] for i, score in zip(found[0], scores[0]) if score > 0]
        if not hits:
            return "No documents match that query."
        return "\n".join(f"[{d['title']}] {d['text']}" for d in hits)


@cache
def tool_schemas() -> list[dict]:
    from rlft.envs.tools import schemas_of

    return schemas_of(SearchEnv, [])


def demonstration(row: dict, **env_kwargs: Any) -> dict:
    """The expert: one search for the row's natural query, then the fact read from the top hit.
    Refuses a row whose top hit does not hold the answer: a demonstration must never teach
    answering past what the tool showed."""
    env = SearchEnv(**env_kwargs)
    env.reset(**row)
    result = env.search(row["query"])
    top = result.splitlines()[0]
    if str(row["answer"]) not in top:
        raise ValueError(f"search for {row['query']!r} does not put the answer {row['answer']!r} first: {top!r}")
    messages = demo_messages(
        row["prompt"], [("search", {"query": row["query"]}, result)], f"The answer is {row['answer']}."
    )
    return {"messages": messages, "tools": tool_schemas()}
