"""The chat service and what it shares with its clients.

`service.ChatService` joins the runtime and the session store (it imports torch);
`types` holds the events and views the TUI and the CLI read (no torch), so importing this
package itself stays light.
"""
