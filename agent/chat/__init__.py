"""The chat service and what it shares with its clients.

`service.ChatService` joins a runtime and the session store. It imports no torch itself: the
runner and model it is given do (the torch `EagerRunner`), or do not (the engine's
`native.runner.EngineRunner`). `types` holds the events and views the TUI and the CLI read.
"""
