"""Validated request bodies -> engine work (`Job`): tokenize, check lengths, sampling params."""

from __future__ import annotations

import asyncio
import time
import uuid

from frota.api.openai_requests import (
    MAX_SEED,
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
)
from frota.engine.context import fit_to_context
from frota.engine.errors import InvalidRequestError
from frota.engine.grammar import Constraint
from frota.engine.sampling_params import SamplingParams
from frota.server import errors, structured, tools
from frota.server.adapters import AdapterRegistry
from frota.server.engine_api import EngineBindings
from frota.server.formats import ChatFormat, CompletionFormat
from frota.server.generation import Job

# Prompts longer than this many characters are tokenized off the event loop.
_INLINE_TOKENIZE_CHARS = 4096


async def _encode(bindings: EngineBindings, text: str) -> list[int]:
    tokenizer = bindings.engine.tokenizer
    if len(text) <= _INLINE_TOKENIZE_CHARS:
        return list(tokenizer.encode(text))
    return list(await asyncio.to_thread(tokenizer.encode, text))


def _fit(ids: list[int], max_tokens: int | None, max_len: int, prompt_param: str) -> int:
    """The max_tokens to use; 400 when the prompt (plus max_tokens) exceeds the context."""
    try:
        return fit_to_context(len(ids), max_len, max_tokens, prompt_param=prompt_param)
    except InvalidRequestError as exc:
        raise errors.from_engine(exc) from exc


def _params(req: SamplingFields, max_tokens: int, logprobs: int | None, choice: int,
            prompt_logprobs: int | None = None,
            constraint: Constraint | None = None) -> SamplingParams:
    if req.min_tokens and req.min_tokens > max_tokens:
        raise errors.invalid(f"min_tokens ({req.min_tokens}) must not exceed max_tokens "
                             f"({max_tokens}).", param="min_tokens")
    seed = None if req.seed is None else (req.seed + choice) % MAX_SEED
    top_k = req.top_k if req.top_k is not None and req.top_k > 0 else None
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=top_k,
            seed=seed,
            stop=list(req.stop or []),
            stop_token_ids=list(req.stop_token_ids or []),
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            logit_bias=req.token_biases(),
            min_tokens=req.min_tokens or 0,
            constraint=constraint,
        )
    except (ValueError, TypeError) as exc:  # InvalidRequestError is a ValueError
        raise errors.invalid(f"Invalid sampling parameters: {exc}",
                             param=getattr(exc, "param", None)) from exc


def _check_supported(req: SamplingFields, models: AdapterRegistry) -> str | None:
    """The adapter `model` names (None: the base model); 404 or 400 for what cannot run."""
    adapter = models.resolve(req.model)
    unsupported = req.unsupported()
    if unsupported is not None:
        raise errors.invalid(unsupported[1], param=unsupported[0], code="unsupported_parameter")
    return adapter


async def completion_job(bindings: EngineBindings, req: CompletionRequest,
                         models: AdapterRegistry) -> Job:
    """`models` resolves `req.model`; replies name the model (or adapter) the request asked for."""
    adapter = _check_supported(req, models)
    prompts: list[list[int]] = []
    for i, prompt in enumerate(req.prompts()):
        param = "prompt" if not isinstance(req.prompt, list) or i == 0 else f"prompt[{i}]"
        if isinstance(prompt, str):
            prompts.append(await _encode(bindings, prompt))
            continue
        if any(t < 0 for t in prompt):  # the engine checks the upper bound
            raise errors.invalid("Token ids in the prompt must not be negative.", param=param)
        prompts.append(prompt)
    max_len = bindings.engine.max_model_len
    max_tokens = [_fit(ids, req.max_tokens, max_len, "prompt") for ids in prompts]
    # echo: the prompt's own logprobs come from prefill (max_tokens 0 needs them to run at all).
    prompt_logprobs = None
    if req.echo and (req.logprobs is not None or req.max_tokens == 0):
        prompt_logprobs = req.logprobs or 0
    params = [_params(req, max_tokens[p], req.logprobs, p * req.n + i, prompt_logprobs)
              for p in range(len(prompts)) for i in range(req.n)]
    echo_texts = None
    if req.echo:
        decode = bindings.engine.tokenizer.decode
        echo_texts = [p if isinstance(p, str) else decode(ids)
                      for p, ids in zip(req.prompts(), prompts, strict=True)]
    request_id = f"cmpl-{uuid.uuid4().hex}"
    fmt = CompletionFormat(request_id, req.model, int(time.time()),
                           bindings.engine.tokenizer.decode, req.logprobs is not None)
    return Job(request_id, prompts, params, req.n, fmt,
               include_usage=bool(req.stream_options and req.stream_options.include_usage),
               echo_texts=echo_texts, adapter=adapter)


def _constraint(bindings: EngineBindings, spec: tuple[str, str] | None,
                param: str) -> Constraint | None:
    """The engine's constraint for (kind, text); 400 when the engine has no grammars."""
    if spec is None:
        return None
    if not bindings.constrained_decoding:
        raise errors.invalid(f"This engine does not support constrained decoding (`{param}`).",
                             param=param, code="unsupported_parameter")
    kind, text = spec
    return Constraint(kind, text)  # type: ignore[arg-type]  # kinds come from structured/tools


async def chat_job(bindings: EngineBindings, req: ChatCompletionRequest,
                   models: AdapterRegistry) -> Job:
    adapter = _check_supported(req, models)
    tool_plan = tools.plan(req)
    forced_call = tool_plan.constraint()  # `required` / a named tool win over response_format
    constraint = _constraint(
        bindings, forced_call or structured.response_format_constraint(req.response_format),
        "tools" if forced_call else "response_format")
    messages = tools.render_messages(req.messages, tool_plan)
    try:
        text = bindings.engine.tokenizer.apply_chat_template(messages)
    except Exception as exc:  # jinja templates raise on sequences they do not accept
        raise errors.invalid(f"The chat template rejected the messages: {exc}",
                             param="messages") from exc
    ids = await _encode(bindings, text)
    max_tokens = _fit(ids, req.requested_max_tokens(), bindings.engine.max_model_len, "messages")
    top = req.top_logprobs or 0
    logprobs = top if req.logprobs else None
    params = [_params(req, max_tokens, logprobs, i, constraint=constraint)
              for i in range(req.n)]
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    fmt_args = (request_id, req.model, int(time.time()), bindings.engine.tokenizer.decode,
                req.logprobs)
    fmt = (tools.ToolChatFormat(*fmt_args, tools=tool_plan.tools) if tool_plan.active
           else ChatFormat(*fmt_args))
    return Job(request_id, [ids], params, req.n, fmt,
               include_usage=bool(req.stream_options and req.stream_options.include_usage),
               adapter=adapter)
