"""Serving hooks for the textgen example: a character-level GRU language model.

This file is packaged as `code/inference.py` beside the weights. It defines the network
too, so the archive needs no other code than torch; training imports the network from
here, so the served class is the trained one.

HTTP (`POST /invocations`, streamed when SageMaker calls InvokeEndpointWithResponseStream):
    {"prompt": "The iris", "max_tokens": 64, "temperature": 1.0, "seed": 7}
`prompt` is required (may be empty); `max_tokens` 1..1024 (default 64); `temperature`
>= 0 (default 1.0; 0 means greedy: always the most likely character); `seed` an integer
for a reproducible answer (default: a fresh random one). A `text/plain` body is the
prompt itself, with the defaults. `predict_fn` returns a generator that yields the
answer one character at a time; the server sends each as its own chunk.

Stateful HTTP sessions (`open_session`, `close_session`; InvokeEndpoint with
`SessionId="NEW_SESSION"`, then the ID the answer gave): each request's prompt continues
the session's conversation, streamed as any answer is, and an empty prompt continues the
last answer. Closed by `{"requestType": "CLOSE"}` (or at its expiry).

WebSocket sessions (`stream_fn`): each message is a prompt, plain text or a JSON object
as above; the answer to each is one generator of characters (one fragmented message).
A bad query option ends the session (close code 1008). The session is stateful: the GRU's hidden state carries over from one message to the
next, so each prompt continues the text of the whole conversation so far (the earlier
prompts and answers), and an empty message continues the last answer. Query options
`max_tokens`, `temperature` and `seed` set the session's defaults; a message's own
options win for that message.

Characters outside the training text's alphabet (accents, tabs, emoji, ...) are read as
a space.
"""

# No `from __future__ import annotations`: dataclasses would then need this module in
# sys.modules, and a script loaded by path (importlib) may not be registered there.
import json
import math
import os
from dataclasses import dataclass, replace
from typing import Iterable, Iterator

import torch
from torch import nn

WEIGHTS = "weights.pt"
VOCAB = "vocab.json"
CONFIG = "config.json"

DEFAULT_MAX_TOKENS = 64
MAX_TOKENS_LIMIT = 1024
DEFAULT_TEMPERATURE = 1.0
# One forward pass over the prompt is cheap, but it runs on the worker's inference
# thread: bound it so one request cannot hold the thread for long.
MAX_PROMPT_CHARS = 16384
# What the model reads before an empty prompt with no history: the corpus's texts start
# after a newline.
START = "\n"
UNKNOWN = " "
JSON_TYPES = ("application/json",)
TEXT_TYPES = ("text/plain",)
REQUEST_KEYS = ("prompt", "max_tokens", "temperature", "seed")


class CharGRU(nn.Module):
    """Characters in, logits of the next character out, with the hidden state exposed
    so generation and sessions can carry it."""

    def __init__(self, vocab_size: int, embedding_dim: int = 64, hidden_size: int = 256, num_layers: int = 1):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.gru = nn.GRU(embedding_dim, hidden_size, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor | None = None):
        """tokens [batch, time] -> (logits [batch, time, vocab], hidden [layers, batch, size])."""
        output, hidden = self.gru(self.embedding(tokens), hidden)
        return self.head(output), hidden


class Vocabulary:
    def __init__(self, chars: list[str]):
        if len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise ValueError("a vocabulary is a list of distinct single characters")
        if UNKNOWN not in chars or START not in chars:
            raise ValueError(f"the vocabulary must hold {UNKNOWN!r} and {START!r}")
        self.chars = list(chars)
        self.index = {c: i for i, c in enumerate(chars)}
        self.unknown = self.index[UNKNOWN]

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        return [self.index.get(c, self.unknown) for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.chars[i] for i in ids)


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = DEFAULT_TEMPERATURE
    seed: int | None = None


class SessionState:
    """Where a conversation stands: the hidden state after every character so far, and
    the logits for the next one. Empty before the first message."""

    def __init__(self):
        self.hidden: torch.Tensor | None = None
        self.logits: torch.Tensor | None = None


class TextGenerator:
    """What model_fn returns: the network on its device, and its vocabulary."""

    def __init__(self, network: CharGRU, vocab: Vocabulary, device: torch.device):
        self.network = network.to(device).eval()
        self.vocab = vocab
        self.device = device

    def _feed(self, text: str, state: SessionState) -> None:
        tokens = torch.tensor([self.vocab.encode(text)], dtype=torch.long, device=self.device)
        logits, state.hidden = self.network(tokens, state.hidden)
        state.logits = logits[0, -1]

    @torch.inference_mode()
    def generate(self, request: GenerationRequest, state: SessionState | None = None,
                 sampler: torch.Generator | None = None) -> Iterator[str]:
        """Yields max_tokens characters, one at a time. `state` (updated in place) is the
        conversation to continue; every character yielded has been fed back into it, so
        closing the generator early leaves the state at exactly the text sent."""
        state = state if state is not None else SessionState()
        if request.prompt:
            self._feed(request.prompt, state)
        elif state.logits is None:
            self._feed(START, state)
        if request.seed is not None:
            sampler = torch.Generator().manual_seed(request.seed)  # the request's own seed wins
        elif sampler is None:
            sampler = torch.Generator()
            sampler.seed()
        for _ in range(request.max_tokens):
            token = self._sample(state.logits, request.temperature, sampler)
            char = self.vocab.chars[token]
            self._feed(char, state)
            yield char

    @staticmethod
    def _sample(logits: torch.Tensor, temperature: float, sampler: torch.Generator) -> int:
        if temperature == 0:
            return int(logits.argmax())
        # Sampled on the CPU with a CPU generator: a seed gives the same draws on any device.
        probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=sampler))


def load_generator(model_dir: str, device: torch.device | str = "cpu") -> TextGenerator:
    with open(os.path.join(model_dir, VOCAB), encoding="utf-8") as f:
        vocab = Vocabulary(json.load(f)["chars"])
    with open(os.path.join(model_dir, CONFIG), encoding="utf-8") as f:
        config = json.load(f)
    network = CharGRU(len(vocab), config["embedding_dim"], config["hidden_size"], config["num_layers"])
    state_dict = torch.load(os.path.join(model_dir, WEIGHTS), map_location="cpu", weights_only=True)
    network.load_state_dict(state_dict)
    return TextGenerator(network, vocab, torch.device(device))


# ---- Parsing requests: one set of rules for HTTP bodies, WebSocket messages and query options ----

def _max_tokens(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"'max_tokens' must be an integer from 1 to {MAX_TOKENS_LIMIT}, not {value!r}")
    if not 1 <= value <= MAX_TOKENS_LIMIT:
        raise ValueError(f"'max_tokens' must be from 1 to {MAX_TOKENS_LIMIT}, not {value}")
    return value


def _temperature(value) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"'temperature' must be a number >= 0 (0: greedy), not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"'temperature' must be a finite number >= 0 (0: greedy), not {value}")
    return float(value)


def _seed(value) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise ValueError(f"'seed' must be an integer from 0 to 2**63-1, not {value!r}")
    return value


def _number_from_text(text: str, name: str, kind=int):
    """Query options arrive as text; JSON fields must already have the right type."""
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"'{name}' must be {'an integer' if kind is int else 'a number'}, not {text!r}") from None


def _prompt(value) -> str:
    if not isinstance(value, str):
        raise ValueError(f"'prompt' must be a string, not {type(value).__name__}")
    if len(value) > MAX_PROMPT_CHARS:
        raise ValueError(f"'prompt' is {len(value)} characters; at most {MAX_PROMPT_CHARS}")
    return value


def parse_request(obj, defaults: GenerationRequest = GenerationRequest("")) -> GenerationRequest:
    """A request object (decoded JSON) -> GenerationRequest; ValueError naming the rule broken."""
    if not isinstance(obj, dict):
        raise ValueError(f'the request must be a JSON object like {{"prompt": "..."}}, not {type(obj).__name__}')
    unknown = sorted(set(obj) - set(REQUEST_KEYS))
    if unknown:
        raise ValueError(f"unknown request field(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(REQUEST_KEYS)}")
    if "prompt" not in obj:
        raise ValueError("'prompt' is required (it may be empty)")
    return GenerationRequest(
        prompt=_prompt(obj["prompt"]),
        max_tokens=_max_tokens(obj["max_tokens"]) if "max_tokens" in obj else defaults.max_tokens,
        temperature=_temperature(obj["temperature"]) if "temperature" in obj else defaults.temperature,
        seed=_seed(obj["seed"]) if "seed" in obj else defaults.seed,
    )


def _text(body: bytes | str) -> str:
    if isinstance(body, str):
        return body
    try:
        return bytes(body).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"the request is not valid UTF-8: {e}") from None


def session_defaults(query: dict[str, str]) -> GenerationRequest:
    """The connection's query options as defaults; other options (the server's own) are ignored."""
    defaults = GenerationRequest("")
    if "max_tokens" in query:
        defaults = replace(defaults, max_tokens=_max_tokens(_number_from_text(query["max_tokens"], "max_tokens")))
    if "temperature" in query:
        temperature = _number_from_text(query["temperature"], "temperature", float)
        defaults = replace(defaults, temperature=_temperature(temperature))
    if "seed" in query:
        defaults = replace(defaults, seed=_seed(_number_from_text(query["seed"], "seed")))
    return defaults


# ---- The SageMaker hooks ----

def model_fn(model_dir: str) -> TextGenerator:
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    generator = load_generator(model_dir, device)
    # One short greedy pass, so the first request pays no allocation or kernel-load cost.
    for _ in generator.generate(GenerationRequest("warm up", max_tokens=2, temperature=0)):
        pass
    return generator


def input_fn(body: bytes, content_type: str) -> GenerationRequest:
    media = (content_type or "").split(";")[0].strip().lower()
    if media in TEXT_TYPES:
        return GenerationRequest(prompt=_prompt(_text(body)))
    if media not in JSON_TYPES:
        raise ValueError(f"content type {content_type!r} is not supported; send application/json "
                         '({"prompt": "...", "max_tokens": N, "temperature": T}) or text/plain (the prompt)')
    try:
        obj = json.loads(_text(body))
    except json.JSONDecodeError as e:
        raise ValueError(f"the request is not valid JSON: {e}") from None
    return parse_request(obj)


def predict_fn(data: GenerationRequest, model: TextGenerator, context=None) -> Iterator[str]:
    """In a stateful session (InvokeEndpoint's SessionId), the prompt continues the
    session's conversation: context.session is its SessionState, which the generator
    updates as it yields; outside one, a fresh conversation."""
    return model.generate(data, getattr(context, "session", None))


def open_session(context) -> SessionState:
    """A stateful session's state: the conversation, empty until its first prompt."""
    return SessionState()


def close_session(state: SessionState, context) -> None:
    """The session ended (closed, expired, or the server stopping): its hidden state,
    on the GPU where the model is, goes now rather than whenever Python collects it."""
    state.hidden = state.logits = None


def stream_fn(messages: Iterable[str | bytes], model: TextGenerator, context) -> Iterator:
    """One WebSocket session. Yields, per prompt, a generator of characters (sent as one
    fragmented message), or {"error": ...} for a message it cannot take (the session
    goes on). The hidden state lives as long as the session: each prompt continues the
    conversation so far."""
    try:
        defaults = session_defaults(dict(getattr(context, "query", None) or {}))
    except ValueError as e:
        # Options are the session's own: with a bad one, no message could be answered as
        # asked. A ValueError ends the session with close code 1008 and this reason.
        raise ValueError(f"bad query option: {e}") from None
    state = SessionState()
    # A query seed seeds the session once, so the whole session replays; a message's own
    # seed replaces it for that message only.
    session_sampler = torch.Generator()
    if defaults.seed is not None:
        session_sampler.manual_seed(defaults.seed)
    else:
        session_sampler.seed()
    defaults = replace(defaults, seed=None)
    for message in messages:
        try:
            request = _session_request(message, defaults)
        except ValueError as e:
            yield {"error": str(e)}
            continue
        yield model.generate(request, state, session_sampler)


def _session_request(message, defaults: GenerationRequest) -> GenerationRequest:
    if not isinstance(message, (str, bytes, bytearray, memoryview)):
        raise ValueError(f"a message must be text or bytes, not {type(message).__name__}")
    # Binary frames are read as UTF-8 text: SageMaker sends BINARY unless the client says UTF8.
    text = _text(message)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        obj = None
    if isinstance(obj, dict):
        return parse_request(obj, defaults)
    return replace(defaults, prompt=_prompt(text))
