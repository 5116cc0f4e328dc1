"""Gemini through ``google-genai``, behind AutoGen's ``ChatCompletionClient`` interface.

AutoGen's own Gemini support goes through an OpenAI-compatible endpoint; this adapter speaks Gemini's
native API instead (system instruction, function declarations and function responses as parts, usage
metadata), so an ``AssistantAgent`` with tools works against it like against any other client.
"""

from __future__ import annotations

import base64
import json
from typing import Any, AsyncGenerator, Literal, Mapping, Optional, Sequence, Union

from autogen_core import CancellationToken, FunctionCall
from autogen_core.models import (
    AssistantMessage,
    ChatCompletionClient,
    CreateResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    ModelCapabilities,
    ModelInfo,
    RequestUsage,
    SystemMessage,
    UserMessage,
)
from autogen_core.tools import Tool, ToolSchema
from google import genai
from google.genai import types

_FINISH = {"STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter", "RECITATION": "content_filter"}


def _schema(tool: Tool | ToolSchema) -> ToolSchema:
    return tool.schema if isinstance(tool, Tool) else tool


def _declaration(tool: Tool | ToolSchema) -> types.FunctionDeclaration:
    schema = _schema(tool)
    return types.FunctionDeclaration(
        name=schema["name"],
        description=schema.get("description", ""),
        parameters_json_schema=dict(schema.get("parameters") or {"type": "object", "properties": {}}),
    )


def _user_parts(content: Any) -> list[types.Part]:
    if isinstance(content, str):
        return [types.Part.from_text(text=content)]
    parts = []
    for item in content:
        if isinstance(item, str):
            parts.append(types.Part.from_text(text=item))
        else:  # autogen Image: a data URI such as data:image/png;base64,....
            header, _, payload = item.data_uri.partition(",")
            mime = header.removeprefix("data:").split(";")[0] or "image/png"
            parts.append(types.Part.from_bytes(data=base64.b64decode(payload), mime_type=mime))
    return parts


def to_contents(messages: Sequence[LLMMessage]) -> tuple[str | None, list[types.Content]]:
    """AutoGen messages as Gemini contents; system messages become the system instruction."""
    system: list[str] = []
    contents: list[types.Content] = []
    names: dict[str, str] = {}
    for message in messages:
        if isinstance(message, SystemMessage):
            system.append(message.content)
        elif isinstance(message, UserMessage):
            contents.append(types.Content(role="user", parts=_user_parts(message.content)))
        elif isinstance(message, AssistantMessage):
            if isinstance(message.content, str):
                parts = [types.Part.from_text(text=message.content)]
            else:
                parts = []
                for call in message.content:
                    names[call.id] = call.name
                    args = json.loads(call.arguments) if call.arguments else {}
                    parts.append(types.Part(function_call=types.FunctionCall(id=call.id, name=call.name, args=args)))
            contents.append(types.Content(role="model", parts=parts))
        elif isinstance(message, FunctionExecutionResultMessage):
            parts = [
                types.Part(function_response=types.FunctionResponse(
                    id=result.call_id, name=result.name or names.get(result.call_id, ""),
                    response={"error" if result.is_error else "result": result.content},
                ))
                for result in message.content
            ]
            contents.append(types.Content(role="user", parts=parts))
    return ("\n\n".join(system) or None), contents


def _usage(metadata: Any) -> RequestUsage:
    if metadata is None:
        return RequestUsage(prompt_tokens=0, completion_tokens=0)
    completion = (metadata.candidates_token_count or 0) + (metadata.thoughts_token_count or 0)
    return RequestUsage(prompt_tokens=metadata.prompt_token_count or 0, completion_tokens=completion)


def _result(parts: list[types.Part], finish: str | None, usage: RequestUsage) -> CreateResult:
    calls = [
        FunctionCall(id=p.function_call.id or f"call_{i}", name=p.function_call.name or "",
                     arguments=json.dumps(p.function_call.args or {}))
        for i, p in enumerate(parts) if p.function_call is not None
    ]
    text = "".join(p.text for p in parts if p.text and not p.thought)
    thought = "".join(p.text for p in parts if p.text and p.thought) or None
    if calls:
        return CreateResult(finish_reason="function_calls", content=calls, usage=usage, cached=False,
                            thought=thought or (text or None))
    reason = _FINISH.get(str(finish.value if hasattr(finish, "value") else finish or "STOP"), "unknown")
    return CreateResult(finish_reason=reason, content=text, usage=usage, cached=False, thought=thought)  # type: ignore[arg-type]


class GeminiChatCompletionClient(ChatCompletionClient):
    """``ChatCompletionClient`` over ``google.genai.Client``; ``base_url`` points it at another server."""

    def __init__(
        self,
        model: str,
        api_key: str,
        base_url: str | None = None,
        api_version: str = "v1beta",
        temperature: float | None = 0.2,
        max_output_tokens: int | None = None,
        timeout_s: float = 120.0,
        family: str = "unknown",
        function_calling: bool = True,
    ) -> None:
        options = types.HttpOptions(base_url=base_url, api_version=api_version, timeout=int(timeout_s * 1000))
        self._client = genai.Client(api_key=api_key, http_options=options)
        self._model = model
        self._temperature = temperature
        self._max_output_tokens = max_output_tokens
        self._info = ModelInfo(vision=True, function_calling=function_calling, json_output=True, family=family,
                               structured_output=True, multiple_system_messages=True)
        self._last = RequestUsage(prompt_tokens=0, completion_tokens=0)
        self._total = RequestUsage(prompt_tokens=0, completion_tokens=0)

    def _config(self, system: str | None, tools: Sequence[Tool | ToolSchema], json_output: Any,
                tool_choice: Any) -> types.GenerateContentConfig:
        config = types.GenerateContentConfig(
            system_instruction=system, temperature=self._temperature, max_output_tokens=self._max_output_tokens,
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        )
        if tools:
            config.tools = [types.Tool(function_declarations=[_declaration(t) for t in tools])]
            mode = {"auto": "AUTO", "required": "ANY", "none": "NONE"}.get(tool_choice if isinstance(tool_choice, str) else "", "ANY")
            allowed = None if isinstance(tool_choice, str) else [_schema(tool_choice)["name"]]
            config.tool_config = types.ToolConfig(function_calling_config=types.FunctionCallingConfig(
                mode=mode, allowed_function_names=allowed))
        if json_output is True:
            config.response_mime_type = "application/json"
        elif isinstance(json_output, type):
            config.response_mime_type = "application/json"
            config.response_json_schema = json_output.model_json_schema()
        return config

    def _account(self, usage: RequestUsage) -> None:
        self._last = usage
        self._total = RequestUsage(prompt_tokens=self._total.prompt_tokens + usage.prompt_tokens,
                                   completion_tokens=self._total.completion_tokens + usage.completion_tokens)

    async def create(
        self,
        messages: Sequence[LLMMessage],
        *,
        tools: Sequence[Tool | ToolSchema] = [],
        tool_choice: Tool | Literal["auto", "required", "none"] = "auto",
        json_output: Optional[bool | type[Any]] = None,
        extra_create_args: Mapping[str, Any] = {},
        cancellation_token: Optional[CancellationToken] = None,
    ) -> CreateResult:
        system, contents = to_contents(messages)
        response = await self._client.aio.models.generate_content(
            model=self._model, contents=contents, config=self._config(system, tools, json_output, tool_choice))
        candidate = response.candidates[0] if response.candidates else None
        parts = list(candidate.content.parts or []) if candidate and candidate.content else []
        usage = _usage(response.usage_metadata)
        self._account(usage)
        return _result(parts, candidate.finish_reason if candidate else None, usage)

    async def create_stream(
        self,
        messages: Sequence[LLMMessage],
        *,
        tools: Sequence[Tool | ToolSchema] = [],
        tool_choice: Tool | Literal["auto", "required", "none"] = "auto",
        json_output: Optional[bool | type[Any]] = None,
        extra_create_args: Mapping[str, Any] = {},
        cancellation_token: Optional[CancellationToken] = None,
        include_usage: bool | None = None,
    ) -> AsyncGenerator[Union[str, CreateResult], None]:
        system, contents = to_contents(messages)
        stream = await self._client.aio.models.generate_content_stream(
            model=self._model, contents=contents, config=self._config(system, tools, json_output, tool_choice))
        parts: list[types.Part] = []
        finish = None
        metadata = None
        async for chunk in stream:
            metadata = chunk.usage_metadata or metadata
            for candidate in chunk.candidates or []:
                finish = candidate.finish_reason or finish
                for part in (candidate.content.parts or []) if candidate.content else []:
                    parts.append(part)
                    if part.text and not part.thought:
                        yield part.text
        usage = _usage(metadata)
        self._account(usage)
        yield _result(parts, finish, usage)

    async def close(self) -> None:
        await self._client.aio.aclose()

    def actual_usage(self) -> RequestUsage:
        return self._last

    def total_usage(self) -> RequestUsage:
        return self._total

    def count_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        # A rough count without a network call: about four characters per token.
        return sum(len(str(getattr(m, "content", ""))) for m in messages) // 4

    def remaining_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        return max(0, 1_000_000 - self.count_tokens(messages, tools=tools))

    @property
    def capabilities(self) -> ModelCapabilities:  # type: ignore[override]
        return ModelCapabilities(vision=True, function_calling=self._info["function_calling"], json_output=True)  # type: ignore[typeddict-item]

    @property
    def model_info(self) -> ModelInfo:
        return self._info
