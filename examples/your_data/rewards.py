"""This example's reward functions: plain callables over a batch of completions.

A reward function gets the prompts, the completions (strings) and every other column of
the data rows as keyword arguments, and returns one float per completion (or None where it
does not apply).
"""


def correct(prompts, completions, answer, **columns):
    """1 when the completion, stripped of spaces, is exactly the answer as written (a number
    in the data, 152, is compared as "152"); else 0."""
    pairs = zip(completions, answer, strict=True)
    return [1.0 if text.strip() == str(target) else 0.0 for text, target in pairs]


def digits_only(prompts, completions, **columns):
    """1 when the completion is a number and nothing else (a small format reward)."""
    return [1.0 if text.strip().isdigit() else 0.0 for text in completions]
