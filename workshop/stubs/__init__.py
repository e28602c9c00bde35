"""Your workshop code: one file per part. Fill in each function, then run
`python -m grpo.workshop check --part N` (or `grpo workshop check --part N`)."""
