"""The search environment's corpus and questions: facts about entities that do not exist.

Every town, ship, river, invention, company and festival in the corpus, and every fact about it,
is drawn from a seeded generator, so neither pretraining nor a lucky guess can supply an answer;
a correct one means the model searched and read. Which entities are asked about in evaluation is
fixed by their position in the corpus, not by the rows' seed, so evaluation entities never reach
training whatever seeds the rows are drawn with.
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any

ENTITIES_PER_KIND = 12
EVAL_EVERY = 6  # entities 0 and 6 of each kind are evaluation entities

# kind: title, subject (how a question names it), the participle for its year, the role of its
# person, a region question's clause and statement, the document text, and what it may be known for.
KINDS: dict[str, dict[str, Any]] = {
    "town": dict(
        title="{n}",
        subject="{n}",
        verb="founded",
        role="founder",
        clause="is {s} located",
        stmt="{s} is located",
        text="{n} is a town in the {r} region. It was founded in {y} by its founder {f} {p} and is known for its {t}.",
        things=[
            "copper lanterns",
            "salt market",
            "clock tower",
            "wool fair",
            "stone bridges",
            "glass workshops",
            "cheese caves",
            "blue roofs",
            "rope makers",
            "tea gardens",
        ],
    ),
    "invention": dict(
        title="{n} {d}",
        subject="the {n} {d}",
        verb="invented",
        role="inventor",
        clause="was {s} invented",
        stmt="{s} was invented",
        text="The {n} {d} is a machine invented in {y} by the inventor {f} {p} in the {r} region. It was used for {t}.",
        devices=["loom", "pump", "lamp", "press", "compass", "kiln"],
        things=[
            "weaving sail cloth",
            "draining mines",
            "lighting harbours",
            "printing maps",
            "measuring tides",
            "firing bricks",
            "cutting ice",
            "sorting grain",
        ],
    ),
    "ship": dict(
        title="{n}",
        subject="the {n}",
        verb="launched",
        role="captain",
        clause="was {s} launched",
        stmt="{s} was launched",
        text="The {n} was a merchant ship launched in {y} from a harbour in the {r} region. "
        "Her captain was {f} {p}, and she carried {t}.",
        things=["salt and timber", "wool", "spices", "copper ore", "tea", "grain", "olive oil", "coal", "silk", "dyes"],
    ),
    "company": dict(
        title="{n} Company",
        subject="the {n} Company",
        verb="founded",
        role="founder",
        clause="is {s} based",
        stmt="{s} is based",
        text="The {n} Company was founded in {y} by its founder {f} {p}. It is based in the {r} region and makes {t}.",
        things=[
            "bicycles",
            "ink",
            "umbrellas",
            "telescopes",
            "wooden toys",
            "buttons",
            "pianos",
            "soap",
            "typewriters",
            "matches",
        ],
    ),
    "festival": dict(
        title="{n} Festival",
        subject="the {n} Festival",
        verb="first held",
        role="organiser",
        clause="is {s} held",
        stmt="{s} is held",
        text="The {n} Festival is held every year in the {r} region. It was first held in {y}, "
        "and its first organiser was {f} {p}. It celebrates {t}.",
        things=[
            "the spring thaw",
            "the apple harvest",
            "the longest night",
            "paper boats",
            "kites",
            "local bakers",
            "the first snow",
            "lantern makers",
        ],
    ),
    "river": dict(
        title="{n} River",
        subject="the {n} River",
        verb="first mapped",
        role="mapmaker",
        clause="does {s} flow",
        stmt="{s} flows",
        text="The {n} River flows through the {r} region. It was first mapped in {y} by the "
        "mapmaker {f} {p} and is known for its {t}.",
        things=[
            "white rapids",
            "silver eels",
            "tall reeds",
            "winter floods",
            "clear water",
            "red clay banks",
            "many waterfalls",
            "otters",
        ],
    ),
}
PHRASINGS: dict[str, dict[str, str]] = {
    "year": {
        "year_what": "In what year was {s} {verb}?",
        "year_when": "When was {s} {verb}? Give the year.",
        "year_which": "{S} was {verb} in which year?",
        "year_tell": "Tell me the year in which {s} was {verb}.",
    },
    "person": {
        "person_who": "Who was the {role} of {s}?",
        "person_surname": "What was the surname of the {role} of {s}?",
        "person_name": "Name the {role} of {s}.",
        "person_which": "Which person was the {role} of {s}? Give the surname.",
    },
    "region": {
        "region_what": "In which region {clause}?",
        "region_which": "Which region {clause} in?",
        "region_name": "Name the region in which {stmt}.",
        "region_stmt": "{Stmt} in which region?",
    },
}
# Demonstrations use only these; evaluation never does (see calculator.DEMO_PHRASING for why).
DEMO_PHRASING = {"year": "year_what", "person": "person_who", "region": "region_what"}

_REGIONS = [
    "Ostrel",
    "Vandemar",
    "Kessary",
    "Lunmoor",
    "Drevik",
    "Palistra",
    "Quorran",
    "Seldany",
    "Thesk",
    "Ambrevale",
]
_FIRST = [
    "Mira",
    "Tam",
    "Edda",
    "Joren",
    "Lisk",
    "Ansel",
    "Brin",
    "Cato",
    "Dena",
    "Ilse",
    "Oren",
    "Pell",
    "Runa",
    "Sabe",
    "Tove",
    "Wendel",
]
_START = [
    "Bal",
    "Cor",
    "Dra",
    "Ell",
    "Fen",
    "Gor",
    "Hal",
    "Ist",
    "Jun",
    "Kel",
    "Lor",
    "Mar",
    "Nor",
    "Ost",
    "Pel",
    "Quil",
    "Ros",
    "Sel",
    "Tam",
    "Ul",
    "Vel",
    "Wyn",
    "Yar",
    "Zor",
]
_MID = ["a", "e", "i", "o", "u", "ar", "en", "is", "or"]
_END = ["beck", "dor", "ven", "mir", "sk", "thal", "wick", "ra", "lin", "mont", "vik", "sa", "len", "gard"]


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


@cache
def _entities(seed: int) -> tuple[dict, ...]:
    """Every entity with its facts; names are unique (case-insensitively) across all roles, so an
    entity's name is a word no other document contains and BM25 finds it by name."""
    rng = random.Random(f"search-corpus:{seed}")
    used = {w.lower() for w in _REGIONS + _FIRST}

    def fresh(parts: list[list[str]]) -> str:
        while True:
            word = "".join(rng.choice(p) for p in parts)
            if word.lower() not in used:
                used.add(word.lower())
                return word

    out = []
    for kind, spec in KINDS.items():
        for i in range(ENTITIES_PER_KIND):
            n, d = fresh([_START, _MID, _END]), rng.choice(spec.get("devices", [""]))
            title, subject = spec["title"].format(n=n, d=d), spec["subject"].format(n=n, d=d)
            year, region = str(rng.randint(1620, 1890)), rng.choice(_REGIONS)
            first, surname = rng.choice(_FIRST), fresh([_START, _END])
            text = spec["text"].format(n=n, d=d, r=region, y=year, f=first, p=surname, t=rng.choice(spec["things"]))
            out.append(
                {
                    "id": f"{kind}-{i:02d}",
                    "kind": kind,
                    "title": title,
                    "subject": subject,
                    "text": text,
                    "split": "eval" if i % EVAL_EVERY == 0 else "train",
                    "facts": {"year": year, "person": surname, "region": region},
                }
            )
    return tuple(out)


def make_corpus(seed: int) -> list[dict]:
    """The documents, as the JSONL file :class:`SearchEnv` reads holds them."""
    return [{"id": e["id"], "title": e["title"], "text": e["text"]} for e in _entities(seed)]


def _question(entity: dict, fact: str, phrasing: str) -> dict:
    spec, s = KINDS[entity["kind"]], entity["subject"]
    clause, stmt = spec["clause"].format(s=s), spec["stmt"].format(s=s)
    prompt = PHRASINGS[fact][phrasing].format(
        s=s, S=_cap(s), verb=spec["verb"], role=spec["role"], clause=clause, stmt=stmt, Stmt=_cap(stmt)
    )
    word = {"year": spec["verb"].split()[-1], "person": spec["role"], "region": "region"}[fact]
    return {
        "prompt": prompt,
        "answer": entity["facts"][fact],
        "phrasing": phrasing,
        "doc_id": entity["id"],
        "entity": entity["title"],
        "query": f"{entity['title']} {word}",
    }


def _rows(split: str, label: str, n: int, seed: int, corpus_seed: int, phrasings: dict[str, list[str]]) -> list[dict]:
    pool = [
        (e, fact, p)
        for e in _entities(corpus_seed)
        if e["split"] == split
        for fact in PHRASINGS
        for p in phrasings[fact]
    ]
    if n > len(pool):
        raise ValueError(f"only {len(pool)} distinct {split} questions exist; asked for {n}")
    rng = random.Random(f"search:{label}:{seed}")
    return [_question(*q) for q in rng.sample(pool, n)]


def make_rows(split: str, n: int, seed: int, corpus_seed: int = 0) -> list[dict]:
    """Distinct questions for RL. ``train`` uses every phrasing, the demonstrations' among them
    (GRPO then has reward to work with from the first step); ``eval`` only the others, and only
    about evaluation entities. Rows carry ``entity`` and ``query`` (the natural search) besides
    prompt/answer/phrasing/doc_id."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    demo = set(DEMO_PHRASING.values())
    return _rows(
        split,
        split,
        n,
        seed,
        corpus_seed,
        {f: [p for p in ps if split == "train" or p not in demo] for f, ps in PHRASINGS.items()},
    )


def demo_rows(n: int, seed: int, corpus_seed: int = 0) -> list[dict]:
    """Questions in the demonstration phrasings, about training entities only."""
    return _rows("train", "demo", n, seed, corpus_seed, {f: [p] for f, p in DEMO_PHRASING.items()})
