"""The textgen example: a real language model, built deterministically, and its serving
hooks exercised as the server calls them, from the packaged code/inference.py."""

import json
import tarfile
import types

import pytest
import torch

from tests.conftest import TEXTGEN_FILES as ARTIFACT_FILES


@pytest.fixture(scope="session")
def hooks(textgen_hooks):
    return textgen_hooks


@pytest.fixture(scope="session")
def model(hooks, textgen_dir):
    return hooks.model_fn(str(textgen_dir))


def generate(hooks, model, **request) -> list[str]:
    body = json.dumps(request).encode()
    return list(hooks.predict_fn(hooks.input_fn(body, "application/json"), model))


def session(hooks, model, messages, **query) -> list:
    """Runs stream_fn to the end; each generator answer joined into its text."""
    answers = hooks.stream_fn(iter(messages), model, types.SimpleNamespace(query=query))
    return [item if isinstance(item, dict) else "".join(item) for item in answers]


# ---- The model ----

def test_packaged_as_model_tar_gz(textgen_dir):
    with tarfile.open(textgen_dir.parent / "textgen.tar.gz") as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile())
    # Files at the archive's root: SageMaker unpacks it straight into /opt/ml/model.
    assert names == ARTIFACT_FILES


# ---- HTTP hooks: input_fn, predict_fn ----

def test_predict_fn_yields_one_character_per_step_up_to_max_tokens(hooks, model):
    pieces = hooks.predict_fn(hooks.input_fn(b'{"prompt": "The iris", "max_tokens": 17}', "application/json"), model)
    assert isinstance(pieces, types.GeneratorType)
    items = list(pieces)
    assert len(items) == 17
    assert all(isinstance(p, str) and len(p) == 1 for p in items)


def test_default_max_tokens_and_text_plain_body(hooks, model):
    request = hooks.input_fn("Iris".encode(), "text/plain; charset=utf-8")
    assert request.prompt == "Iris"
    assert len(list(hooks.predict_fn(request, model))) == hooks.DEFAULT_MAX_TOKENS


def test_a_seed_makes_the_answer_reproducible(hooks, model):
    a = generate(hooks, model, prompt="Number of", max_tokens=40, temperature=0.8, seed=11)
    b = generate(hooks, model, prompt="Number of", max_tokens=40, temperature=0.8, seed=11)
    c = generate(hooks, model, prompt="Number of", max_tokens=40, temperature=0.8, seed=12)
    assert a == b and a != c
    greedy = [generate(hooks, model, prompt="The data", max_tokens=20, temperature=0) for _ in range(2)]
    assert greedy[0] == greedy[1]


def test_characters_outside_the_vocabulary_read_as_a_space(hooks, model):
    assert "é" not in model.vocab.index
    assert generate(hooks, model, prompt="caf\u00e9", max_tokens=20, seed=1) == \
        generate(hooks, model, prompt="caf ", max_tokens=20, seed=1)


def test_closing_the_stream_early_is_clean(hooks, model):
    pieces = hooks.predict_fn(hooks.input_fn(b'{"prompt": "", "max_tokens": 1000}', "application/json"), model)
    assert len([next(pieces) for _ in range(3)]) == 3
    pieces.close()
    with pytest.raises(StopIteration):
        next(pieces)
    # Inference mode held only while the generator runs, never leaked to its caller.
    assert not torch.is_inference_mode_enabled()


def test_closing_early_leaves_the_state_at_the_text_sent(hooks, model):
    state = hooks.SessionState()
    pieces = model.generate(hooks.GenerationRequest("The wine", max_tokens=50, seed=2), state)
    sent = "".join(next(pieces) for _ in range(5))
    pieces.close()
    replay = hooks.SessionState()
    for _ in model.generate(hooks.GenerationRequest("The wine" + sent, max_tokens=1, temperature=0), replay):
        pass
    # replay has also read its one generated character; compare before that step.
    check = hooks.SessionState()
    model._feed("The wine" + sent, check)
    torch.testing.assert_close(state.hidden, check.hidden)


@pytest.mark.parametrize("body, content_type, message", [
    (b'{"prompt": "a", "max_tokens": 0}', "application/json", "'max_tokens' must be from 1 to 1024"),
    (b'{"prompt": "a", "max_tokens": 1025}', "application/json", "'max_tokens' must be from 1 to 1024"),
    (b'{"prompt": "a", "max_tokens": "5"}', "application/json", "'max_tokens' must be an integer"),
    (b'{"prompt": "a", "max_tokens": 2.5}', "application/json", "'max_tokens' must be an integer"),
    (b'{"prompt": "a", "max_tokens": true}', "application/json", "'max_tokens' must be an integer"),
    (b'{"prompt": "a", "temperature": -0.5}', "application/json", "'temperature' must be a finite number >= 0"),
    (b'{"prompt": "a", "temperature": NaN}', "application/json", "'temperature' must be a finite number >= 0"),
    (b'{"prompt": "a", "temperature": "hot"}', "application/json", "'temperature' must be a number"),
    (b'{"prompt": "a", "seed": -1}', "application/json", "'seed' must be an integer"),
    (b'{"prompt": 5}', "application/json", "'prompt' must be a string"),
    (b'{"max_tokens": 5}', "application/json", "'prompt' is required"),
    (b'{"prompt": "a", "max_token": 5}', "application/json", "unknown request field(s) 'max_token'"),
    (b'["a"]', "application/json", "must be a JSON object"),
    (b'{"prompt": ', "application/json", "not valid JSON"),
    (b'{"prompt": "\xff"}', "application/json", "not valid UTF-8"),
    (b'{"prompt": "a"}', "application/x-npy", "content type 'application/x-npy' is not supported"),
    (b"a" * 20000, "text/plain", "'prompt' is 20000 characters; at most 16384"),
])
def test_bad_requests_raise_value_error_naming_the_rule(hooks, body, content_type, message):
    with pytest.raises(ValueError) as raised:
        hooks.input_fn(body, content_type)
    assert message in str(raised.value)


# ---- WebSocket sessions: stream_fn ----

def test_each_prompt_is_answered_by_a_generator_of_pieces(hooks, model):
    answers = hooks.stream_fn(iter(["The iris", b'{"prompt": "Number", "max_tokens": 5}']), model,
                              types.SimpleNamespace(query={}))
    first = next(answers)
    assert isinstance(first, types.GeneratorType)
    assert all(isinstance(p, str) for p in first)
    second = list(next(answers))
    assert len(second) == 5  # a binary message is read as UTF-8 text, its JSON options honoured
    with pytest.raises(StopIteration):
        next(answers)


def test_the_session_carries_its_state_from_message_to_message(hooks, model):
    first, answer = "The iris dataset", '{"prompt": " Number of", "max_tokens": 40, "seed": 5}'
    opening, continued = session(hooks, model, [first, answer], seed="9")
    # The second answer is what a fresh session gives when told the whole conversation at once.
    whole = json.dumps({"prompt": first + opening + " Number of", "max_tokens": 40, "seed": 5})
    assert session(hooks, model, [whole]) == [continued]
    # ...and so depends on the first exchange. One follow-up may happen to match a fresh
    # session's (the same seed draws the same random numbers); not all of them.
    follow_ups = [json.dumps({"prompt": p, "max_tokens": 40, "seed": 5}) for p in ("e", " ", "the", "Wine")]
    fresh = [session(hooks, model, [m])[0] for m in follow_ups]
    after = [session(hooks, model, [first, m], seed="9")[1] for m in follow_ups]
    assert fresh != after


def test_an_empty_message_continues_the_last_answer(hooks, model):
    state = hooks.SessionState()
    whole = "".join(model.generate(hooks.GenerationRequest("Iris", max_tokens=30, seed=8), state))
    split = session(hooks, model, ["Iris", ""], max_tokens="15", seed="8")
    assert "".join(split) == whole


def test_query_options_are_the_session_defaults(hooks, model):
    answers = session(hooks, model, ["a", '{"prompt": "b", "max_tokens": 3}', "c"], max_tokens="7", temperature="0.5",
                      seed="1")
    assert [len(a) for a in answers] == [7, 3, 7]
    # A query seed makes the whole session replay; other query options (the server's) are ignored.
    assert session(hooks, model, ["a", "c"], max_tokens="7", temperature="0.5", seed="1", accept="x") == \
        [answers[0], session(hooks, model, ["a", "c"], max_tokens="7", temperature="0.5", seed="1")[1]]


def test_a_bad_message_gets_an_error_and_the_session_goes_on(hooks, model):
    answers = session(hooks, model, ['{"prompt": "a", "max_tokens": 5000}', b"\xff\xfe", '{"max_tokens": 2}', "ok"],
                      max_tokens="4")
    assert answers[0] == {"error": "'max_tokens' must be from 1 to 1024, not 5000"}
    assert "not valid UTF-8" in answers[1]["error"]
    assert "'prompt' is required" in answers[2]["error"]
    assert isinstance(answers[3], str) and len(answers[3]) == 4


def test_a_bad_query_option_ends_the_session_with_its_reason(hooks, model):
    # The server closes the session with 1008 and this message as the reason.
    with pytest.raises(ValueError, match="bad query option: 'temperature' must be a number, not 'warm'"):
        session(hooks, model, ["a", "b"], temperature="warm")
