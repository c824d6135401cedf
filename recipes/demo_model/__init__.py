"""The recipe of the bundled demo model (agent/models/demo), outside the installed package.

`plan.py` lists every training stage that shipped; `python -m recipes.demo_model.build
--seed 0 --out DIR` runs it from scratch: data (`corpus` + `vocab` + `dialogues` +
`worlds` + `keys`, written by `data`), tokenizer (`data.train_tokenizer`), one training
call per stage (`train`, `weighted`), checks and evaluation (`recall_eval`) and the model
card (`card`). What was tried and not shipped: docs/recipe-experiments.md, and the code of
the trials still runnable in recipes/experiments/.
"""
