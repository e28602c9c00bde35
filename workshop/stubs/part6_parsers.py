"""Part 6: a reward parser, composed from small parsers (picoRL, after Ludic).

A parser turns text into an action and says what that earned:
`parser(text) -> ParseResult(action, reward, obs)`, with `action` None when
parsing failed and `obs` a message for the model (e.g. "Put your answer between
<answer> and </answer>."). Small parsers compose into one:

    def to_int(text):  # a parser of your own: an int, or a failure with feedback
        text = text.strip()
        if text.lstrip("-").isdigit():
            return ParseResult(int(text), 1.0)
        return ParseResult(None, -0.5, "Answer with a whole number.")

    parse = compose_parsers(tag_parser("answer", reward=0.1, penalty=-1.0), to_int)
    parse("think <answer> 42 </answer>")  ->  ParseResult(42, 1.1, None)

The rollout loop (part 4) hands the parsed action to the environment, and a
failure's `obs` to the model instead. `tag_parser`, `regex_parser` and
`strip_parser` in grpo/rewards/parsers.py are building blocks to try it with.

Check: python -m workshop.check --part 6
Library version: grpo/rewards/parsers.py.
"""

from __future__ import annotations

from grpo.rewards.parsers import Parser, ParseResult

__all__ = ["ParseResult", "compose_parsers"]


def compose_parsers(*parsers: Parser) -> Parser:
    """One parser that runs `parsers` in order, short-circuiting on the first failure.

    returns a function raw -> ParseResult such that:
    - each parser is called on the action the previous one produced (the first on raw);
    - rewards add up along the chain;
    - the first failure (action None) stops the chain: later parsers never run, and
      the result is ParseResult(None, rewards so far + its reward, its obs);
    - on success the result is ParseResult(last action, total reward, None): the obs of
      successful steps are dropped (only a failure talks back to the model).

    Hint: start from current = ParseResult(action=raw, reward=0.0, obs=None).
    """
    raise NotImplementedError("part 6: write compose_parsers")
