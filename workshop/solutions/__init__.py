"""The library's own functions, under the names the stubs use.

Each file re-exports what `grpo` itself runs, so a solution can never drift
from the library: `python -m workshop.check --module workshop.solutions`
passes every part.
"""
