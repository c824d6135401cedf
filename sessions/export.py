"""Export a session branch as JSON (what `laplace finetune` reads) or Markdown. Pure functions."""

from __future__ import annotations

from typing import Any, Sequence

from .records import Session, Turn


def session_dict(s: Session) -> dict[str, Any]:
    return {
        "uid": s.uid, "name": s.name, "model_id": s.model_id, "system_prompt": s.system_prompt,
        "options": s.options, "created_at": s.created_at, "updated_at": s.updated_at,
        "archived": s.archived, "keep_snapshots": s.keep_snapshots,
        "forked_from_session_id": s.forked_from_session_id,
    }


def to_json(s: Session, branch: Sequence[Turn]) -> dict[str, Any]:
    """`messages` keeps every turn with its status, so a trainer can skip cancelled replies."""
    messages = [
        {"role": t.role, "content": t.content, "status": t.status, "turn_id": t.id,
         "n_tokens": t.n_tokens, "created_at": t.created_at,
         **({"kind": "recall"} if _is_recall(t) else {})}
        for t in branch
        # an empty root (no system prompt) is not a message anyone wrote
        if not (t.role == "system" and not t.content)
    ]
    return {"format": "laplace.session.v1", "session": session_dict(s), "messages": messages}


def to_markdown(s: Session, branch: Sequence[Turn]) -> str:
    lines = [f"# {s.name or 'Session ' + s.short_id}", "",
             f"- id: `{s.uid}`", f"- model: `{s.model_id}`", f"- created: {s.created_at}", ""]
    for t in branch:
        if t.role == "system" and not t.content:
            continue
        flag = "" if t.status == "complete" else f" ({t.status})"
        role = "recall (document)" if _is_recall(t) else t.role
        lines += [f"## {role}{flag}", "", t.content, ""]
    return "\n".join(lines).rstrip() + "\n"


def _is_recall(t: Turn) -> bool:
    """A recall block that recall refresh folded in (not something anyone wrote)."""
    return t.role == "document" and t.stats.get("kind") == "recall"
