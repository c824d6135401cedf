"""Recall probes: measure what a fixed recurrent state still remembers.

Imports only `agent.runtime` and `agent.recall` (never chat, sessions, textual or
sqlite_utils). Modules:
`text`/`fillers`/`tasks` generate seeded samples, `engine` asks a state, `ledger` holds the
probes only a fixed state allows (retention ledger, counterfactual trace, resume check),
`suites`/`runner` plan and run a sweep, `report`/`table`/`plot` render it, and
`session_check` asks a copy of a saved session's state.
"""
