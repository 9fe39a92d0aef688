"""Writes the worked example's data (deterministic; the JSONL files are committed):

* sft.jsonl: prompt/response rows in a mix of styles (plain, polite, polite and rambling), so the SFT
  model can answer in each of them;
* prefs_train.jsonl / prefs_eval.jsonl: preference pairs: the polite, concise answer is chosen over
  a curt one and over a rambling one;
* prompts_train.jsonl / prompts_eval.jsonl: prompts for GRPO and its held-out evaluation (other topics).

    python examples/rlhf/make_data.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOPICS = [
    "the sun",
    "the moon",
    "coffee",
    "tea",
    "rain",
    "snow",
    "the ocean",
    "mountains",
    "bicycles",
    "trains",
    "libraries",
    "gardens",
    "bread",
    "music",
    "chess",
    "autumn",
    "rivers",
    "owls",
    "bees",
    "maps",
    "clocks",
    "candles",
    "bridges",
    "forests",
    "deserts",
    "islands",
    "kites",
    "lanterns",
    "violins",
    "boats",
    "apples",
    "honey",
    "stars",
    "clouds",
    "wind",
    "volcanoes",
    "penguins",
    "dolphins",
    "castles",
    "windmills",
    "glaciers",
    "meadows",
    "caves",
    "markets",
    "museums",
    "letters",
    "poems",
    "puzzles",
]
QUESTIONS = ["What is {t}?", "Tell me about {t}.", "Why do people like {t}?", "Can you describe {t}?"]
FACTS = [
    "{T} is something many people find interesting.",
    "{T} has a long and curious history.",
    "{T} can be found in many places around the world.",
    "{T} is simple to enjoy and easy to learn about.",
]
POLITE = "Thank you for asking! "
RAMBLE = (
    " There is so much more that could be said about this, and honestly one could go on and on for a very "
    "long time, covering every little detail, every story and every opinion that anyone has ever had."
)
CURT = "Ugh, fine. "


def _rows(topics: list[str], rng: random.Random) -> list[tuple[str, str]]:
    out = []
    for t in topics:
        for q in QUESTIONS:
            out.append((q.format(t=t), rng.choice(FACTS).format(T=t[0].upper() + t[1:])))
    return out


def main() -> None:
    rng = random.Random(0)
    train_topics, eval_topics = TOPICS[:36], TOPICS[36:]
    train, held = _rows(train_topics, rng), _rows(eval_topics, rng)
    styles = [lambda f: f, lambda f: f, lambda f: POLITE + f, lambda f: POLITE + f + RAMBLE, lambda f: CURT + f]
    sft = [{"prompt": p, "response": styles[i % len(styles)](f)} for i, (p, f) in enumerate(train)]
    prefs = []
    for p, f in train:
        prefs.append({"prompt": p, "chosen": POLITE + f, "rejected": rng.choice([f, CURT + f])})
        prefs.append({"prompt": p, "chosen": POLITE + f, "rejected": POLITE + f + RAMBLE})
    eval_prefs = [
        {"prompt": p, "chosen": POLITE + f, "rejected": r} for p, f in held for r in (f, CURT + f, POLITE + f + RAMBLE)
    ]
    rng.shuffle(prefs)
    files = {
        "sft.jsonl": sft,
        "prefs_train.jsonl": prefs,
        "prefs_eval.jsonl": eval_prefs,
        "prompts_train.jsonl": [{"prompt": p} for p, _ in train],
        "prompts_eval.jsonl": [{"prompt": p} for p, _ in held],
    }
    for name, rows in files.items():
        (HERE / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{name}: {len(rows)} rows")


if __name__ == "__main__":
    main()
