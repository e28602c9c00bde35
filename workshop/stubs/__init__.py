"""Your workshop code: one file per part. Fill in each function, then run
`python -m workshop.check --part N`."""
