"""Tools and tool turns into the chat template.

A template that takes ``tools`` (and renders ``tool_calls``) gets them as
transformers passes them. A template that knows nothing of tools (SmolLM2's,
most older ones) would drop them silently; for it the tools are described in
the system message in the hermes format the default parser reads, earlier
calls are written back as ``<tool_call>`` text, and tool results become user
turns in ``<tool_response>`` tags (such templates often accept no ``tool`` role).
"""
from __future__ import annotations

import functools
import json
import re
from typing import Any, Optional

TOOLS_PROMPT = """# Tools

You may call one or more of the functions below to answer the user.

The functions, one JSON signature per line, inside <tools></tools> tags:
<tools>
{tools}
</tools>

To call a function, reply with a JSON object holding its name and arguments inside <tool_call></tool_call> tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


@functools.lru_cache(maxsize=16)
def _mentions(template: str, word: str) -> bool:
    return re.search(rf"\b{word}\b", template) is not None


def template_takes(template: Any, variable: str) -> bool:
    """True if the template reads ``variable`` (a template mapping is taken to: transformers picks its tool one)."""
    return not isinstance(template, str) or _mentions(template, variable)


def call_text(call: dict[str, Any]) -> str:
    """One earlier call in the hermes format."""
    fn = call["function"]
    return "<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": fn["arguments"]},
                                        ensure_ascii=False) + "\n</tool_call>"


def _calls_as_text(dicts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    merged_tool_turn = False
    for m in dicts:
        m = dict(m)
        if m["role"] == "tool":
            m.pop("tool_call_id", None)
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if merged_tool_turn:  # results of one turn's calls go back in one user turn
                out[-1]["content"] += "\n" + block
                continue
            m = {"role": "user", "content": block}
            merged_tool_turn = True
        else:
            merged_tool_turn = False
        calls = m.pop("tool_calls", None)
        if calls:
            texts = ([m["content"]] if m.get("content") else []) + [call_text(c) for c in calls]
            m["content"] = "\n".join(texts)
        out.append(m)
    return out


def _with_tools_prompt(dicts: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    prompt = TOOLS_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
    if dicts and dicts[0]["role"] == "system":
        first = dict(dicts[0], content=f"{dicts[0]['content']}\n\n{prompt}" if dicts[0]["content"] else prompt)
        return [first] + dicts[1:]
    return [{"role": "system", "content": prompt}] + dicts


def prepare_messages(dicts: list[dict[str, Any]], tools: Optional[list[dict[str, Any]]],
                     template: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and extra template arguments that put ``tools`` and tool turns into the prompt."""
    if not template_takes(template, "tool_calls"):
        dicts = _calls_as_text(dicts)
    if not tools:
        return dicts, {}
    if template_takes(template, "tools"):
        return dicts, {"tools": tools}
    return _with_tools_prompt(dicts, tools), {}
