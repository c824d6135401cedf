"""Recipes that build shipped artefacts from scratch (the bundled default model).

`python -m agent.recipes.build_default --seed 0` rebuilds `agent/models/default/`: data
(`corpus` + `dialogues`), tokenizer (`tokenizer_train`), staged training with the project's
own Trainer (Muon + AdamW), evaluation (`recall_eval`) and the model card.
"""
