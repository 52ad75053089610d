"""The wire protocol module with no server: what each bad frame is answered, the limits on what an
error echoes back (exactly at each limit and one past it), and the frames' text."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError, field_validator

from envsdk.protocol import (
    MAX_ECHOED_CHARS,
    MAX_REPORTED_ERRORS,
    ErrorCode,
    FrameError,
    McpReply,
    ObservationReply,
    SessionInfo,
    StepRequest,
    code_for_peer,
    decode_reply,
    decode_request,
    dumps,
    encode,
    encode_mcp,
    encode_observation,
    error_reply,
    extra_key_error,
    frame_size,
    observation_reply,
    session_reply,
    shorten_input,
    state_reply,
    validate_model,
    validation_errors,
    validation_message,
)


def _refusal(raw: str | bytes, **kwargs: Any) -> FrameError:
    with pytest.raises(FrameError) as caught:
        decode_request(raw, **kwargs)
    return caught.value


# ---------------------------------------------------------------- error codes for each peer


@pytest.mark.parametrize("code", list(ErrorCode))
def test_a_peer_that_asked_for_the_extensions_gets_every_code_as_it_is(code: ErrorCode) -> None:
    assert code_for_peer(code, extended=True) is code


@pytest.mark.parametrize("code", list(ErrorCode))
def test_a_plain_openenv_peer_gets_execution_error_for_envsdks_step_refusals(code: ErrorCode) -> None:
    refusals = {ErrorCode.NOT_RESET, ErrorCode.EPISODE_DONE}
    assert code_for_peer(code, extended=False) is (ErrorCode.EXECUTION_ERROR if code in refusals else code)


# ---------------------------------------------------------------- decoding requests


@pytest.mark.parametrize(
    ("raw", "kind", "fields"),
    [
        ('{"type":"reset"}', "reset", {"data": {}, "id": None}),
        ('{"type":"reset","data":{"seed":3},"id":"r1"}', "reset", {"data": {"seed": 3}, "id": "r1"}),
        ('{"type":"step","data":{"message":"hi"}}', "step", {"data": {"message": "hi"}}),
        ('{"type":"state"}', "state", {}),
        ('{"type":"close"}', "close", {}),
        ('{"type":"session","id":"s"}', "session", {"id": "s"}),
        ('{"type":"mcp","data":{"jsonrpc":"2.0","id":1,"method":"tools/list"}}', "mcp", {"data": {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}}),
    ],
)
def test_each_request_type_is_decoded_into_its_model(raw: str, kind: str, fields: dict[str, Any]) -> None:
    for given in (raw, raw.encode()):
        request = decode_request(given)
        assert request.type == kind
        for name, value in fields.items():
            assert getattr(request, name) == value


def test_a_frame_of_exactly_the_limit_passes_and_one_byte_more_is_too_large() -> None:
    raw = '{"type":"step","data":{"message":"' + "é" * 20 + '"}}'  # 20 characters of 2 bytes each
    size = len(raw.encode())
    assert size == len(raw) + 20
    assert decode_request(raw, max_bytes=size).type == "step"
    refused = _refusal(raw, max_bytes=size - 1)
    assert refused.code is ErrorCode.FRAME_TOO_LARGE
    assert refused.message == f"Frame of {size} bytes exceeds the limit of {size - 1} bytes"
    assert refused.details == {"limit": size - 1}
    ascii_frame = '{"type":"state"}'
    assert decode_request(ascii_frame, max_bytes=len(ascii_frame)).type == "state"
    assert _refusal(ascii_frame, max_bytes=len(ascii_frame) - 1).code is ErrorCode.FRAME_TOO_LARGE
    assert _refusal(ascii_frame.encode(), max_bytes=len(ascii_frame) - 1).code is ErrorCode.FRAME_TOO_LARGE


@pytest.mark.parametrize("text", ["abc", "é" * 10, "日本" * 7, "😀" * 3, "a😀b", ""])
def test_frame_size_is_the_utf8_size_wherever_the_limit_could_be_passed(text: str) -> None:
    utf8 = len(text.encode())
    for limit in range(len(text), utf8 + 2):
        size = frame_size(text, limit)
        assert (size > limit) == (utf8 > limit), (text, limit, size)
        if len(text) <= limit < 4 * len(text):
            assert size == utf8
    assert frame_size(text.encode(), 0) == frame_size(text.encode(), utf8) == utf8


@pytest.mark.parametrize("raw", ["{not json", "", '{"type": "step"', b"\xff\xfe", '{"type":"reset","data":{"s":"\\ud800"}}'])
def test_what_is_not_json_text_is_invalid_json(raw: str | bytes) -> None:
    refused = _refusal(raw)
    assert refused.code is ErrorCode.INVALID_JSON and refused.message.startswith("Invalid JSON: ")
    assert refused.details == {}


@pytest.mark.parametrize(("raw", "kind"), [("[1, 2]", "list"), ('"hello"', "str"), ("3", "int"), ("null", "NoneType")])
def test_a_frame_that_is_not_an_object_is_a_validation_error(raw: str, kind: str) -> None:
    refused = _refusal(raw)
    assert refused.code is ErrorCode.VALIDATION_ERROR
    assert refused.message == f"A frame must be a JSON object, got {kind}"
    assert refused.details == {"errors": [{"type": "dict_type", "loc": [], "msg": "Input should be a valid dictionary"}]}


@pytest.mark.parametrize(
    ("frame", "shown"),
    [
        ({"type": "bogus"}, "bogus"),
        ({"data": {}}, ""),
        ({"type": None}, ""),
        ({"type": 5}, "5"),
        ({"type": ["a"]}, "['a']"),
        ({"type": "x" * 300}, "x" * MAX_ECHOED_CHARS + "... (44 more characters)"),
        ({"type": list(range(20))}, repr("<array of 20 items, too long to echo>")),
    ],
)
def test_an_unknown_type_is_named_shortened(frame: dict[str, Any], shown: str) -> None:
    refused = _refusal(json.dumps(frame))
    assert refused.code is ErrorCode.UNKNOWN_TYPE
    assert refused.message == f"Unknown message type: {shown}"


def test_a_step_without_data_names_the_missing_field() -> None:
    refused = _refusal('{"type":"step"}')
    assert refused.code is ErrorCode.VALIDATION_ERROR
    assert refused.message == "Invalid message: data: Field required"
    assert [e["loc"] for e in refused.details["errors"]] == [["data"]]
    assert "errors_omitted" not in refused.details


def test_a_request_id_of_128_characters_passes_and_129_is_refused() -> None:
    assert decode_request(json.dumps({"type": "state", "id": "i" * 128})).id == "i" * 128
    refused = _refusal(json.dumps({"type": "state", "id": "i" * 129}))
    assert refused.code is ErrorCode.VALIDATION_ERROR
    assert [e["loc"] for e in refused.details["errors"]] == [["id"]]
    assert refused.details["errors"][0]["type"] == "string_too_long"


def _frame_with_extras(extras: int, **known: Any) -> dict[str, Any]:
    return {"type": "step", **known, **{f"k{i:03d}": i for i in range(extras)}}


def test_exactly_the_most_reported_errors_are_listed_without_an_omitted_count() -> None:
    refused = _refusal(json.dumps(_frame_with_extras(MAX_REPORTED_ERRORS, data={})))
    assert refused.code is ErrorCode.VALIDATION_ERROR
    assert len(refused.details["errors"]) == MAX_REPORTED_ERRORS
    assert "errors_omitted" not in refused.details
    assert refused.message.endswith(f"(and {MAX_REPORTED_ERRORS - 3} more)")


def test_one_unknown_key_past_the_limit_is_counted_not_listed() -> None:
    refused = _refusal(json.dumps(_frame_with_extras(MAX_REPORTED_ERRORS + 1, data={})))
    assert refused.code is ErrorCode.VALIDATION_ERROR
    assert refused.message == f"Invalid message: {MAX_REPORTED_ERRORS + 1} unknown field(s)"
    errors = refused.details["errors"]
    assert len(errors) == MAX_REPORTED_ERRORS and refused.details["errors_omitted"] == 1
    assert errors[0] == {"type": "extra_forbidden", "loc": ["k000"], "msg": "Extra inputs are not permitted", "input": 0}
    assert [e["loc"] for e in errors] == [[f"k{i:03d}"] for i in range(MAX_REPORTED_ERRORS)]


def test_many_unknown_keys_beside_a_missing_field_list_the_field_first_and_count_the_rest() -> None:
    refused = _refusal(json.dumps(_frame_with_extras(30, id="a")))
    errors = refused.details["errors"]
    assert errors[0]["loc"] == ["data"] and errors[0]["type"] == "missing"
    assert [e["loc"] for e in errors[1:]] == [[f"k{i:03d}"] for i in range(MAX_REPORTED_ERRORS - 1)]
    assert refused.details["errors_omitted"] == 30 + 1 - MAX_REPORTED_ERRORS
    assert refused.message == "Invalid message: 30 unknown field(s)"


def test_many_unknown_keys_of_a_valid_frame_are_all_extra_errors() -> None:
    refused = _refusal(json.dumps(_frame_with_extras(25, data={"m": 1})))
    assert all(e["type"] == "extra_forbidden" for e in refused.details["errors"])
    assert refused.details["errors_omitted"] == 25 - MAX_REPORTED_ERRORS


class _Loose(BaseModel):
    count: int


def test_a_model_that_allows_extra_keys_is_validated_whatever_their_number() -> None:
    data = {"count": 3, **{f"k{i}": i for i in range(50)}}
    assert validate_model(_Loose, data).count == 3
    with pytest.raises(FrameError) as caught:
        validate_model(_Loose, {**data, "count": "many"})
    assert caught.value.message == "Invalid message: count: Input should be a valid integer, unable to parse string as an integer"


def test_more_field_errors_than_the_limit_are_counted() -> None:
    class Wide(BaseModel):
        model_config = {"extra": "forbid"}
        fields: list[int]

    with pytest.raises(FrameError) as caught:
        validate_model(Wide, {"fields": ["x"] * (MAX_REPORTED_ERRORS + 5)})
    assert len(caught.value.details["errors"]) == MAX_REPORTED_ERRORS
    assert caught.value.details["errors_omitted"] == 5


# ---------------------------------------------------------------- what an error echoes


def test_a_string_of_the_limit_is_echoed_whole_and_a_longer_one_cut_with_a_count() -> None:
    assert shorten_input("a" * MAX_ECHOED_CHARS) == "a" * MAX_ECHOED_CHARS
    assert shorten_input("a" * MAX_ECHOED_CHARS + "bc") == "a" * MAX_ECHOED_CHARS + "... (2 more characters)"


def test_an_integer_past_256_bits_is_described_and_a_bool_is_itself() -> None:
    assert shorten_input(2**256 - 1) == 2**256 - 1
    assert shorten_input(2**256) == "<integer of 257 bits>"
    assert shorten_input(-(2**300)) == "<integer of 301 bits>"
    assert shorten_input(True) is True and shorten_input(1.5) == 1.5 and shorten_input(None) is None


def test_containers_of_eight_items_are_echoed_and_of_nine_described() -> None:
    assert shorten_input(list(range(8))) == list(range(8))
    assert shorten_input(list(range(9))) == "<array of 9 items, too long to echo>"
    eight = {str(i): i for i in range(8)}
    assert shorten_input(eight) == eight
    assert shorten_input({str(i): i for i in range(9)}) == "<object of 9 items, too long to echo>"


def test_containers_four_levels_down_are_described_as_too_deep() -> None:
    assert shorten_input([[[["x"]]]]) == [[[["x"]]]]
    assert shorten_input([[[[["x"]]]]]) == [[[["<array of 1 items, too deep to echo>"]]]]
    assert shorten_input({"a": {"b": {"c": {"d": {"e": 1}}}}}) == {"a": {"b": {"c": {"d": "<object of 1 items, too deep to echo>"}}}}
    # Too long and too deep at once: said to be too long.
    assert shorten_input([[[[list(range(9))]]]]) == [[[["<array of 9 items, too long to echo>"]]]]
    assert shorten_input([[[[list(range(8))]]]]) == [[[["<array of 8 items, too deep to echo>"]]]]


def test_keys_and_values_inside_containers_are_shortened_too() -> None:
    long = "k" * (MAX_ECHOED_CHARS + 1)
    assert shorten_input({long: [long]}) == {long[:MAX_ECHOED_CHARS] + "... (1 more characters)": [long[:MAX_ECHOED_CHARS] + "... (1 more characters)"]}
    assert shorten_input({1: 2}) == {"1": 2}


def test_validation_errors_are_json_data_with_their_inputs_shortened() -> None:
    class Strict(BaseModel):
        model_config = {"extra": "forbid"}
        name: int

    with pytest.raises(ValidationError) as caught:
        Strict.model_validate({"name": "x" * 300, "other": list(range(20))})
    errors = validation_errors(caught.value)
    assert [e["loc"] for e in errors] == [["name"], ["other"]]
    assert errors[0]["input"] == "x" * MAX_ECHOED_CHARS + "... (44 more characters)"
    assert errors[1]["input"] == "<array of 20 items, too long to echo>"
    assert json.loads(json.dumps(errors)) == errors


def test_an_exception_in_a_validation_errors_context_is_sent_as_its_text() -> None:
    class Checked(BaseModel):
        n: int

        @field_validator("n")
        @classmethod
        def positive(cls, value: int) -> int:
            if value <= 0:
                raise ValueError("must be positive")
            return value

    with pytest.raises(ValidationError) as caught:
        Checked.model_validate({"n": -1})
    (error,) = validation_errors(caught.value)
    assert error["ctx"] == {"error": "must be positive"} and error["input"] == -1


def test_an_extra_key_error_is_pydantics_with_its_key_and_value_shortened() -> None:
    long = "v" * (MAX_ECHOED_CHARS + 3)
    assert extra_key_error(long, long, ("data",)) == {
        "type": "extra_forbidden",
        "loc": ["data", long[:MAX_ECHOED_CHARS] + "... (3 more characters)"],
        "msg": "Extra inputs are not permitted",
        "input": long[:MAX_ECHOED_CHARS] + "... (3 more characters)",
    }


@pytest.mark.parametrize(
    ("errors", "message"),
    [
        ([], "Invalid action"),
        ([{"loc": ["message"], "msg": "Field required"}], "Invalid action: message: Field required"),
        ([{"loc": [], "msg": "Bad"}], "Invalid action: (message): Bad"),
        ([{"msg": "Bad"}], "Invalid action: (message): Bad"),
        ([{"loc": ["a", 0, "b"]}], "Invalid action: a.0.b: "),
        (
            [{"loc": [n], "msg": "m"} for n in "abc"],
            "Invalid action: a: m; b: m; c: m",
        ),
        (
            [{"loc": [n], "msg": "m"} for n in "abcd"],
            "Invalid action: a: m; b: m; c: m (and 1 more)",
        ),
        (
            [{"loc": [n], "msg": "m"} for n in "abcde"],
            "Invalid action: a: m; b: m; c: m (and 2 more)",
        ),
    ],
)
def test_the_sentence_of_a_validation_error_names_three_fields_then_counts(errors: list[dict[str, Any]], message: str) -> None:
    assert validation_message("Invalid action", errors) == message


# ---------------------------------------------------------------- replies and their text


def test_every_reply_type_is_decoded_and_anything_else_is_a_value_error() -> None:
    assert isinstance(decode_reply('{"type":"observation","data":{"observation":{"a":1},"reward":1,"done":true}}'), ObservationReply)
    assert decode_reply('{"type":"state","data":{"step_count":2}}').data == {"step_count": 2}
    error = decode_reply(b'{"type":"error","data":{"message":"m","code":"TIMEOUT","limit":3}}')
    assert error.type == "error" and error.data.code == "TIMEOUT" and error.data.details == {"limit": 3}
    session = decode_reply('{"type":"session","data":{"session_id":"s","resume_token":"t","resume_window_s":5}}')
    assert session.type == "session" and session.data.resume_window_s == 5.0
    assert isinstance(decode_reply('{"type":"mcp","data":{"jsonrpc":"2.0"},"id":"x"}'), McpReply)
    for bad in ('{"type":"nope"}', "[]", "{", '{"type":"error","data":{}}'):
        with pytest.raises(ValueError):
            decode_reply(bad)


def test_a_reply_with_a_lone_surrogate_is_read_by_the_stdlib_parser() -> None:
    reply = decode_reply('{"type":"state","data":{"text":"\\ud800"}}')
    assert reply.data == {"text": "\ud800"}


def test_a_reply_nested_past_the_recursion_limit_is_a_value_error_naming_the_depth() -> None:
    with pytest.raises(ValueError) as caught:
        decode_reply('{"type":"state","data":{"x":' + "[" * 100_000 + "]" * 100_000 + "}}")
    assert str(caught.value) == "the frame's JSON is nested too deep to decode"


def test_dumps_is_compact_unescaped_json_with_non_finite_numbers_as_null() -> None:
    text = dumps({"a": [1, 2.5], "é": math.nan, "b": -math.inf, "c": "日本"})
    assert text == '{"a":[1,2.5],"é":null,"b":null,"c":"日本"}'


def test_a_reply_carries_its_id_only_when_the_request_had_one() -> None:
    assert json.loads(encode(state_reply({"s": 1}))) == {"type": "state", "data": {"s": 1}}
    assert json.loads(encode(state_reply({"s": 1}, request_id="r"))) == {"id": "r", "type": "state", "data": {"s": 1}}
    assert json.loads(encode_mcp({"result": 1})) == {"type": "mcp", "data": {"result": 1}}
    assert json.loads(encode_mcp({"result": 1}, request_id="r")) == {"id": "r", "type": "mcp", "data": {"result": 1}}
    assert encode_mcp({"result": 1}, request_id="r") == encode(McpReply(id="r", data={"result": 1}))


def test_an_observation_lifts_reward_and_done_and_repeats_non_empty_metadata() -> None:
    plain = json.loads(encode_observation({"text": "hi"}, 0.5, 1, metadata={}))  # type: ignore[arg-type]
    assert plain == {"type": "observation", "data": {"observation": {"text": "hi"}, "reward": 0.5, "done": True}}
    with_meta = json.loads(encode_observation({"text": "hi"}, None, False, metadata={"success": True}, request_id="q"))
    assert with_meta == {
        "id": "q",
        "type": "observation",
        "data": {"observation": {"text": "hi"}, "reward": None, "done": False, "metadata": {"success": True}},
    }
    model = observation_reply({"text": "hi"}, 2, False, metadata={"m": 1}, request_id="q")
    assert model.id == "q" and model.data.reward == 2 and model.data.model_extra == {"metadata": {"m": 1}}
    assert observation_reply({}, 1, False, metadata={}).data.model_extra == {}


def test_a_reward_of_another_type_goes_through_the_models_coercion() -> None:
    class Scalar(float):
        pass

    assert json.loads(encode_observation({}, Scalar(0.25), False, metadata={"m": 1}, request_id="r")) == {
        "id": "r", "type": "observation", "data": {"observation": {}, "reward": 0.25, "done": False, "metadata": {"m": 1}},
    }
    with pytest.raises(ValidationError):
        encode_observation({}, "high", False)  # type: ignore[arg-type]


def test_error_replies_carry_the_code_text_and_every_detail() -> None:
    for code in (ErrorCode.CAPACITY_REACHED, "CAPACITY_REACHED"):
        reply = error_reply(code, "full", request_id="r", active_sessions=2, max_sessions=2)
        assert json.loads(encode(reply)) == {
            "id": "r", "type": "error",
            "data": {"message": "full", "code": "CAPACITY_REACHED", "active_sessions": 2, "max_sessions": 2},
        }
    refused = FrameError(ErrorCode.FRAME_TOO_LARGE, "too big", limit=10)
    assert str(refused) == "too big"
    reply = refused.to_reply("r9")
    assert reply.id == "r9" and reply.data.code == "FRAME_TOO_LARGE" and reply.data.message == "too big"
    assert reply.data.details == {"limit": 10}
    assert FrameError(ErrorCode.TIMEOUT, "late").to_reply().id is None


def test_a_session_reply_holds_the_handshake_and_its_request_id() -> None:
    info = SessionInfo(session_id="s", resume_token="t", resume_window_s=30.0, deadlines_s={"step": 2.0})
    reply = session_reply(info, request_id="h")
    assert reply.id == "h" and reply.type == "session" and reply.data is info
    decoded = decode_reply(encode(reply))
    assert decoded.data == info and decoded.id == "h"


def test_a_step_request_round_trips_through_its_text() -> None:
    request = StepRequest(data={"message": "x"}, id="a")
    assert decode_request(encode(request)) == request
