"""Recipes that build shipped artefacts from scratch (the bundled default model).

`python -m recipes.default_model.build_default --seed 0` rebuilds `agent/models/default/`: data
(`corpus` + `vocab` + `dialogues`), tokenizer (`data.train_tokenizer`), phase 1 (staged
training with the project's own Trainer, Muon + AdamW), phase 2 (`phase2`: long-range
recall), evaluation (`recall_eval`) and the model card (`card`).
"""
