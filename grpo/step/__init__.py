"""One GRPO update: sample and score (`collect`), advantages, the loss (`objective`),
mini-batches and the optimizer step (`trainer`)."""
