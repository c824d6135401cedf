"""Recipes that build the project's shipped artefacts from scratch (run from the repository root).

Not part of the installed package: pyproject.toml's package list names only `agent` and
`sessions`, and nothing under agent/ imports from here.
"""
