"""The hooks' request context without a server: which hooks take one (read from their
signatures once), the headers' read-only, any-case view, and which custom attributes
may go back as a header."""

from __future__ import annotations

import pytest

from smserve.core.context import RequestContext, response_custom_attributes
from smserve.engine.hooks.script import Hooks
from smserve.routes.table import RouteTable
from smserve.streaming.session import SessionContext


def test_a_hook_takes_a_context_when_its_last_parameter_is_named_so():
    def input_fn(body, content_type, context):
        return context

    def predict_fn(data, model, *, context=None):  # keyword-only: called the same way
        return context

    def output_fn(prediction, accept, *args, **kwargs):  # catch-alls are not a context
        return args

    hooks = Hooks(input_fn=input_fn, predict_fn=predict_fn, output_fn=output_fn)
    assert (hooks.input_context, hooks.predict_context, hooks.output_context) == (True, True, False)
    assert hooks.wants_context
    assert hooks.predict_fn("data", "model", "the context") == "the context"
    assert hooks.output_with(lambda: "unused") is output_fn
    assert not Hooks(input_fn=lambda body, content_type: body).wants_context


def test_a_generator_predict_fn_with_a_keyword_context_still_streams():
    def predict_fn(data, model, *, context):
        yield context

    hooks = Hooks(predict_fn=predict_fn)
    assert hooks.streams and hooks.predict_context
    assert list(hooks.predict_fn(1, 2, "c")) == ["c"]


def test_output_with_binds_the_requests_context():
    made = []

    def output_fn(prediction, accept, context):
        return prediction, accept, context

    def context_of():
        made.append(1)
        return "ctx"

    bound = Hooks(output_fn=output_fn).output_with(context_of)
    assert bound("p", "a") == ("p", "a", "ctx")
    assert made == [1]


def test_the_context_reads_sagemakers_headers_in_any_case_and_cannot_change_them():
    context = RequestContext({"X-AMZN-SAGEMAKER-CUSTOM-ATTRIBUTES": "a=1", "X-AMZN-SAGEMAKER-INFERENCE-ID": "i",
                              "CONTENT-TYPE": "application/json"}, "/invocations", "x=1&y=")
    assert (context.custom_attributes, context.inference_id, context.target_model) == ("a=1", "i", None)
    assert context.headers["content-type"] == context.headers.get("Content-Type") == "application/json"
    assert "Content-Type" in context.headers and "accept" not in context.headers
    assert set(context.headers) == {"x-amzn-sagemaker-custom-attributes", "x-amzn-sagemaker-inference-id",
                                    "content-type"}
    assert context.query == {"x": "1", "y": ""}
    with pytest.raises(TypeError):
        context.headers["content-type"] = "text/csv"  # read-only
    assert RequestContext({}, target_model="m").target_model == "m"
    assert RequestContext({"X-AMZN-SAGEMAKER-TARGET-MODEL": "h.tar.gz"}, target_model="m").target_model == "h.tar.gz"


def test_a_sessions_messages_share_its_headers_but_not_their_context():
    session = SessionContext({"X-AMZN-SAGEMAKER-CUSTOM-ATTRIBUTES": "s"}, "/chat", "lang=fr", "127.0.0.1:1")
    one, two = session.for_message(), session.for_message()
    assert one is not two and one.headers is session.headers
    assert (one.path, one.query, one.custom_attributes) == ("/chat", {"lang": "fr"}, "s")
    assert session.peer == "127.0.0.1:1" and session.shutting_down is False


@pytest.mark.parametrize("value, sent", [
    (None, None),
    ("k=v, trace=1", "k=v, trace=1"),
    ("x" * 1024, "x" * 1024),
    ("x" * 1025, None),          # over SageMaker's limit
    ("a\r\nSet-Cookie: x", None),  # no header injection
    ("caf\u00e9", None),          # visible ASCII only
    (42, None),
])
def test_only_a_header_worthy_value_is_sent_back(value, sent):
    context = RequestContext({})
    context.response_custom_attributes = value
    assert response_custom_attributes(context) == sent


def test_a_path_of_any_route_whatever_its_method_is_the_tables():
    table = RouteTable()
    table.add("POST", "/invocations", lambda r: None)
    table.add("GET", "/v2/models/{model}/ready", lambda r: None)
    assert table.has_path("/invocations") and table.has_path("/v2/models/m/ready")
    assert not table.has_path("/chat") and not table.has_path("/v2/models/m/other")
