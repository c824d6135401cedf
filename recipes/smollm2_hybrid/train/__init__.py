"""Attention transfer of the hybrid's GLA branch: the per-layer parts (`attention`), the data
(`mix`), the resumable run (`transfer`, plan.json) and the branch taken out of it (`export`).
Results in TRANSFER.md. Imports the corpus's output files, never the measurements."""
