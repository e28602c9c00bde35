"""The GRPO workshop: write the pieces that matter, check them with the library's tests.

`workshop.stubs` holds the functions to write (one file per part),
`workshop.solutions` the library's own versions of the same functions.
See workshop/README.md.
"""
