"""Optimizers: power limit (`power_limit`), batch size (`batch_size`), pipeline frequency
(`perseus`)."""
