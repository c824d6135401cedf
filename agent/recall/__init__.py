"""Recall refresh, and what a fixed state still recalls: one package that chat and probes share.

`rule` chooses which faded turns to read again and renders the block; `horizon` says how
far back a detail counts as faded (the model card, else the heads' half-lives read by
`decays`, an input-driven mixer's measured on `smalltalk`); `options` are the settings a
session stores; `verdicts` are the words a recall check answers with. Imports the runtime
(and, for `rule`, `verdicts` and `smalltalk`, nothing at all); never chat or the probes.
"""
