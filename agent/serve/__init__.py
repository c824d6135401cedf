"""`laplace serve`: an OpenAI-compatible HTTP server over the session store.

`protocol` reads requests (no torch), `scheduler` batches every request in flight on one
thread that owns the model, committing each turn through `agent.chat.turns` exactly as
`laplace chat` does, `app` is the Starlette face, `server` binds and runs uvicorn,
`compiling` logs every compile so none goes unnoticed after warm-up.
"""
