"""The window hybrid of a Llama teacher (issue 26): measurements behind its defaults."""
