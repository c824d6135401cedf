"""The GLA runtime: config, ops, model, state, sampling, generation, tokenizer, I/O, devices.

torch only: this package never imports the UI, SQLite or anything from `sessions`.
"""
