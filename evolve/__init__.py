"""evolve: evolutionary program search whose LLM mutator learns from its own archive."""
