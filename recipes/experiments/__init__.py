"""Training experiments tried beside the demo model's plan and not shipped.

The plan that made the bundled model is recipes/demo_model/ alone; what is here builds on
it without changing it: phase 6's plain-speech trial (`phase6`, its data in `natural` and
`natural_phrasings`, the generator of `natural_cache.json` in `generate_natural`, the copying
check `natural_check`) and a toy associative-recall drill (`assoc_check`). What each
measured: docs/recipe-experiments.md.
"""
