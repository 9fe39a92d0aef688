"""The worked example's independent check (TRL reward signature): 1.0 for an answer that is polite
(thanks the user) and concise (at most 25 words), else 0.0. The reward model never sees this rule;
it learns what the preference pairs show, and this rule says whether the policy really improved."""


def polite_and_concise(prompts, completions, **kwargs):
    out = []
    for text in completions:
        words = text.split()
        out.append(float("thank" in text.lower() and 0 < len(words) <= 25 and "ugh" not in text.lower()))
    return out
