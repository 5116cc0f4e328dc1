"""The Gemini adapter, with the real google-genai client, against a loopback Gemini REST server."""

from __future__ import annotations

import asyncio
import json

import pytest
from autogen_core import FunctionCall
from autogen_core.models import AssistantMessage, CreateResult, FunctionExecutionResult, FunctionExecutionResultMessage, SystemMessage, UserMessage
from autogen_core.tools import FunctionTool

from maxkernel.llm.gemini import GeminiChatCompletionClient
from maxkernel.llm.retry import RetryingClient
from servers import Reply, ScriptedServer, gemini_call, gemini_error, gemini_text


@pytest.fixture
def server():
    s = ScriptedServer().start()
    yield s
    s.stop()


def client(server: ScriptedServer) -> GeminiChatCompletionClient:
    return GeminiChatCompletionClient("gemini-test", "test-key", base_url=server.url, timeout_s=10)


def lookup(name: str) -> str:
    """Look up an API."""
    return name


def test_text_reply_usage_and_request_shape(server: ScriptedServer) -> None:
    server.replies.append(Reply(body=gemini_text("hello", prompt=13, completion=4)))
    c = client(server)
    result = asyncio.run(c.create([SystemMessage(content="be brief"), UserMessage(content="hi", source="user")]))
    assert result.content == "hello" and result.finish_reason == "stop"
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (13, 4)
    assert c.total_usage().prompt_tokens == 13
    req = server.received[0]
    assert req.path.endswith("/v1beta/models/gemini-test:generateContent")
    assert req.headers["x-goog-api-key"] == "test-key"
    assert req.body["systemInstruction"]["parts"][0]["text"] == "be brief"
    assert req.body["contents"] == [{"role": "user", "parts": [{"text": "hi"}]}]


def test_function_calling_round_trip(server: ScriptedServer) -> None:
    server.replies += [Reply(body=gemini_call("lookup", {"name": "pl.BlockSpec"})), Reply(body=gemini_text("done"))]
    c = client(server)
    tool = FunctionTool(lookup, description="Look up an API.")
    first = asyncio.run(c.create([UserMessage(content="look it up", source="user")], tools=[tool]))
    assert first.finish_reason == "function_calls"
    assert isinstance(first.content, list) and first.content[0].name == "lookup"
    assert json.loads(first.content[0].arguments) == {"name": "pl.BlockSpec"}
    decl = server.received[0].body["tools"][0]["functionDeclarations"][0]
    # protobuf JSON accepts either spelling of the field; this SDK version sends the snake_case one
    schema = decl.get("parametersJsonSchema") or decl["parameters_json_schema"]
    assert decl["name"] == "lookup" and schema["properties"]["name"]["type"] == "string"
    assert server.received[0].body["toolConfig"]["functionCallingConfig"]["mode"] == "AUTO"
    history = [
        UserMessage(content="look it up", source="user"),
        AssistantMessage(content=[FunctionCall(id="fc_1", name="lookup", arguments='{"name": "pl.BlockSpec"}')], source="a"),
        FunctionExecutionResultMessage(content=[FunctionExecutionResult(content="BlockSpec(...)", name="lookup", call_id="fc_1")]),
    ]
    second = asyncio.run(c.create(history, tools=[tool]))
    assert second.content == "done"
    contents = server.received[1].body["contents"]
    assert contents[1]["role"] == "model" and contents[1]["parts"][0]["functionCall"]["name"] == "lookup"
    assert contents[2]["parts"][0]["functionResponse"] == {"id": "fc_1", "name": "lookup", "response": {"result": "BlockSpec(...)"}}


def test_streaming(server: ScriptedServer) -> None:
    chunks = [
        {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hel"}]}}]},
        {"candidates": [{"content": {"role": "model", "parts": [{"text": "lo"}]}, "finishReason": "STOP"}],
         "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 2, "totalTokenCount": 11}},
    ]
    server.replies.append(Reply(sse=chunks))
    c = client(server)

    async def collect() -> list:
        return [x async for x in c.create_stream([UserMessage(content="hi", source="user")])]

    out = asyncio.run(collect())
    assert out[:-1] == ["Hel", "lo"]
    final = out[-1]
    assert isinstance(final, CreateResult) and final.content == "Hello" and final.usage.completion_tokens == 2
    assert ":streamGenerateContent" in server.received[0].path and "alt=sse" in server.received[0].path


def test_rate_limit_and_5xx_are_retried(server: ScriptedServer) -> None:
    server.replies += [Reply(429, gemini_error(429, "RESOURCE_EXHAUSTED")), Reply(503, gemini_error(503, "UNAVAILABLE")),
                       Reply(body=gemini_text("finally"))]
    c = RetryingClient(client(server), max_retries=3, base_delay_s=0.01)
    result = asyncio.run(c.create([UserMessage(content="hi", source="user")]))
    assert result.content == "finally" and c.retries == 2 and len(server.received) == 3


def test_bad_request_is_not_retried(server: ScriptedServer) -> None:
    server.replies += [Reply(400, gemini_error(400, "INVALID_ARGUMENT")), Reply(body=gemini_text("never"))]
    c = RetryingClient(client(server), max_retries=3, base_delay_s=0.01)
    with pytest.raises(Exception, match="400"):
        asyncio.run(c.create([UserMessage(content="hi", source="user")]))
    assert len(server.received) == 1


def test_timeout_is_retried(server: ScriptedServer) -> None:
    server.replies += [Reply(body=gemini_text("late"), delay_s=3.0), Reply(body=gemini_text("in time"))]
    inner = GeminiChatCompletionClient("gemini-test", "test-key", base_url=server.url, timeout_s=1.0)
    c = RetryingClient(inner, max_retries=2, base_delay_s=0.01)
    result = asyncio.run(c.create([UserMessage(content="hi", source="user")]))
    assert result.content == "in time" and c.retries == 1 and len(server.received) == 2


def test_images_go_inline(server: ScriptedServer) -> None:
    from autogen_core import Image
    from PIL import Image as PILImage

    server.replies.append(Reply(body=gemini_text("a black square")))
    picture = Image(PILImage.new("RGB", (2, 2)))
    asyncio.run(client(server).create([UserMessage(content=["what is this?", picture], source="user")]))
    parts = server.received[0].body["contents"][0]["parts"]
    inline = parts[1].get("inlineData") or parts[1]["inline_data"]
    assert parts[0] == {"text": "what is this?"}
    assert (inline.get("mimeType") or inline["mime_type"]) == "image/png" and inline["data"]
