"""Part 5, the assistant mask by incremental tokenisation: the library's version."""

from grpo.envs.chat_mask import tokenize_with_assistant_mask

__all__ = ["tokenize_with_assistant_mask"]
