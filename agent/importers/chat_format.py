"""A checkpoint's Jinja chat template, rendered once in a sandbox into a `SegmentTemplate`.

Each role's message is rendered with a placeholder as its content, in the context a chat
gives it (after a system message; an assistant message after a user one), and the text on
either side of the placeholder becomes that role's prefix and suffix. The template must be
prefix-stable (rendering one more message only appends text), as chat templates are made
to be; one that is not is refused with a way out (`--plain-template`).

A checkpoint without a template (a base model) gets a plain one: "User: ...", "Assistant:
..."; its reply ends at the end-of-text token or at a blank line. It starts with the BOS
that transformers would put before any text: the one the tokenizer's post-processor adds.
"""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from agent.importers.source import CheckpointError, TokenizerFiles
from agent.runtime.templates import SegmentTemplate
from agent.runtime.tokenizer import Tokenizer

PLACEHOLDER = "\u2063laplace-content-{n}\u2063"
FIXED_DATE = _dt.datetime(2026, 1, 1)  # templates that print today's date get a fixed one: turns tokenize the same every day


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = FIXED_DATE.strftime
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
    return env


def stop_tokens(files: TokenizerFiles, tok: Tokenizer) -> list[str]:
    """The tokens that end a reply: generation_config's eos ids, then the tokenizer's eos."""
    ids = files.generation.get("eos_token_id")
    ids = ids if isinstance(ids, list) else [ids] if isinstance(ids, int) else []
    names = [tok.hf.id_to_token(i) for i in ids if isinstance(i, int)]
    eos = files.special("eos_token")
    names += [eos] if eos else []
    out = [n for n in dict.fromkeys(names) if n and tok.hf.token_to_id(n) is not None]
    if not out:
        raise CheckpointError("no end-of-text token found (generation_config.json eos_token_id, tokenizer_config.json eos_token); a reply could never end")
    return out


def segment_template(files: TokenizerFiles, tok: Tokenizer, *, plain: bool = False) -> SegmentTemplate:
    stops = stop_tokens(files, tok)
    if plain or not files.chat_template:
        return plain_template(tok, stops, bos=added_bos(files, tok))
    try:
        return _render_segments(files, stops)
    except CheckpointError:
        raise
    except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:  # the template is third-party code
        raise CheckpointError(f"the checkpoint's chat template cannot be rendered ({exc}); import with --plain-template") from None


def _render_segments(files: TokenizerFiles, stops: list[str]) -> SegmentTemplate:
    env = _environment()
    template = env.from_string(files.chat_template or "")
    bos = files.special("bos_token") or ""
    specials = {"bos_token": bos, "eos_token": files.special("eos_token") or ""}

    def render(messages: list[dict[str, str]], gen: bool = False) -> str:
        return template.render(messages=messages, add_generation_prompt=gen, **specials)

    def extend(before: list[dict[str, str]], role: str, n: int) -> tuple[str, str]:
        """(prefix, suffix) of a `role` message appended to `before`."""
        base = render(before) if before else ""
        text = render(before + [{"role": role, "content": PLACEHOLDER.format(n=n)}])
        if not text.startswith(base):
            raise CheckpointError("the chat template is not prefix-stable (a new message changes earlier text); import with --plain-template")
        head, sep, tail = text[len(base):].partition(PLACEHOLDER.format(n=n))
        if not sep:
            raise CheckpointError("the chat template drops message contents; import with --plain-template")
        return head, tail

    system = {"role": "system", "content": PLACEHOLDER.format(n=0)}
    try:
        sys_prefix, sys_suffix = extend([], "system", 0)
    except TemplateError:  # a template without a system role: the system prompt goes in as a user message
        sys_prefix = sys_suffix = None
    first = [system] if sys_prefix is not None else []
    user = extend(first, "user", 1)
    after_user = first + [{"role": "user", "content": PLACEHOLDER.format(n=1)}]
    assistant = extend(after_user, "assistant", 2)
    prompt = render(after_user, gen=True)
    reply_open = prompt[len(render(after_user)):]
    if sys_prefix is None:
        sys_prefix, sys_suffix = user
    if bos and sys_prefix.startswith(bos):  # the BOS belongs to the session's first message only
        sys_prefix = sys_prefix[len(bos):]
        if not first:  # no system role: the user prefix was rendered as the first message, BOS and all
            user = (user[0][len(bos):], user[1])
    else:
        bos = ""
    # Some templates put the assistant's opening inside its message; a reply must read the same.
    if not reply_open:
        reply_open = assistant[0]
    roles = {"system": (sys_prefix, sys_suffix), "user": user, "assistant": (reply_open, assistant[1]),
             "document": user}  # attached files and recall blocks: a user turn that says what it is
    default = _default_system(render, bos, first, roles) if first else ""
    return SegmentTemplate(roles_text=roles, reply_open=reply_open, bos=bos, stop_tokens=tuple(stops), source="jinja",
                           default_system=default)


def _default_system(render: Any, bos: str, first: list[dict[str, str]], roles: dict[str, tuple[str, str]]) -> str:
    """The system prompt a template writes on its own when a chat has none: the text
    between the system prefix and suffix when a lone user message is rendered ("" if the
    template writes no system message then)."""
    user = {"role": "user", "content": PLACEHOLDER.format(n=1)}
    text = render([user])
    (sp, ss), (up, us) = roles["system"], roles["user"]
    head, tail = bos + sp, ss + up + user["content"] + us
    if text.startswith(head) and text.endswith(tail) and len(text) >= len(head) + len(tail):
        return text[len(head): len(text) - len(tail)]
    return ""


def added_bos(files: TokenizerFiles, tok: Tokenizer) -> str:
    """The BOS text transformers puts before a text for this tokenizer, or "": `bos_token`
    when the tokenizer's post-processor adds it (Llama 3's adds <|begin_of_text|>). Its
    `add_bos_token` setting is not read: transformers' generic tokenizer ignores it too."""
    bos = files.special("bos_token")
    if not bos or tok.hf.token_to_id(bos) is None:
        return ""
    return bos if tok.hf.encode("x", add_special_tokens=True).ids[:1] == [tok.token_id(bos)] else ""


def plain_template(tok: Tokenizer, stops: list[str], *, bos: str = "") -> SegmentTemplate:
    """For base models: plain-text turns, after `bos`; a blank line ends a reply when it is one token."""
    blank = tok.encode("\n\n")
    extra_stop = [tok.hf.id_to_token(blank[0])] if len(blank) == 1 else []
    roles = {"system": ("", "\n\n"), "user": ("User: ", "\n\n"), "assistant": ("Assistant: ", "\n\n"),
             "document": ("User: ", "\n\n")}
    return SegmentTemplate(roles_text=roles, reply_open="Assistant:", bos=bos, stop_tokens=tuple(stops + extra_stop), source="plain")


def describe(template: SegmentTemplate) -> dict[str, Any]:
    return {"chat_template": template.source, "stop_tokens": list(template.stop_tokens)}
