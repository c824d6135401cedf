"""How smollm2-hybrid's answer delta was made (agent/models/smollm2/ANSWER.md): generated
dialogues in which the assistant answers from the conversation or says it was not told,
and a LoRA fine-tune on them with `laplace finetune --tune lora`."""
