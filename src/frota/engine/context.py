"""Whether a request fits the context window, decided once for the engine and the server.

A request holds its prompt plus what it generates, at most `max_model_len` tokens. The engine
takes any non-empty prompt that fits (`room=0`: a prompt filling the window still gets one
token, finish_reason "length"); the OpenAI routes also ask the prompt to leave room for a
token and, given `max_tokens`, for all of them (the completion budget they default to).
Torch-free: the server imports it.
"""

from __future__ import annotations

from frota.engine.errors import ContextLengthError, InvalidRequestError


def fit_to_context(num_prompt_tokens: int, max_model_len: int, max_tokens: int | None = None,
                   *, room: int = 1, prompt_param: str = "prompt") -> int:
    """The most tokens the request may generate: `max_tokens`, or what the window leaves when
    it is None. Raises InvalidRequestError for an empty prompt, ContextLengthError when the
    prompt leaves fewer than `room` tokens or prompt plus `max_tokens` overflows the window."""
    if num_prompt_tokens == 0:
        raise InvalidRequestError("The prompt is empty; send at least one token.", prompt_param)
    if num_prompt_tokens + room > max_model_len:
        raise ContextLengthError(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{num_prompt_tokens} tokens. Shorten the prompt.", prompt_param)
    if max_tokens is None:
        return max_model_len - num_prompt_tokens
    if num_prompt_tokens + max_tokens > max_model_len:
        raise ContextLengthError(
            f"This model's maximum context length is {max_model_len} tokens, but you requested "
            f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the prompt, "
            f"{max_tokens} for the completion). Reduce the prompt or max_tokens.", "max_tokens")
    return max_tokens
