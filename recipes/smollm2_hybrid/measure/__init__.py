"""Measurements of the hybrid's variants: perplexity (`perplexity`, the one implementation the
others use), held-out perplexity by position and the comparison table (`evaluate`), perplexity
and decode speed of the import's options (`variants`), the combine-mode experiment (`combine`),
decode speed against the teacher's KV cache (`kv_decode`), and the window's bounded memory
against full attention and the window alone (`memory`, its table `memory_report`)."""
