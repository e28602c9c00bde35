"""A whole run: its config, the loop of steps with schedule and evaluation, data, metrics,
run directories with checkpoints, and the text entry point."""
