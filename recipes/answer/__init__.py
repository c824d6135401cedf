"""How smollm2-hybrid's answer delta is made (agent/models/smollm2/ANSWER.md): generated
dialogues in which the assistant answers from the conversation or says it was not told,
and a LoRA fine-tune on them with `laplace finetune --tune lora`.

concepts: the training detail types; dialogues: the first runs' data (run3-run7); mix: issue
36's mix (in-window, recall block, updates, never given, anchors); requests: anchor and
held-out everyday requests; teacher: the base model's replies (resumable); heldout2: the
second held-out set; measure and check: the floors on held-out material."""
