"""Measurements of the hybrid's variants: perplexity (`perplexity`, the one implementation the
others use), held-out perplexity by position and the comparison table (`evaluate`), perplexity
and decode speed of the import's options (`variants`), the combine-mode experiment (`combine`)
and decode speed against the teacher's KV cache (`kv_decode`)."""
