"""The emulator reads `/generate` bodies as SGLang 0.5.23 does.

The contract error texts below are the ones SGLang's own decoder (`sglang.api.v1.api_types`)
returns for the same bodies; they were compared once against it, outside this project.
"""

from __future__ import annotations

from typing import Any

import pytest

from inference_auctions.server.emulator.sglang_request import ContractError, parse_generate_body

_SAMPLING_FIELDS = (
    "`max_new_tokens`, `stop`, `stop_token_ids`, `stop_regex`, `temperature`, `top_p`, `top_k`, "
    "`min_p`, `frequency_penalty`, `presence_penalty`, `repetition_penalty`, `min_new_tokens`, "
    "`n`, `json_schema`, `regex`, `ebnf`, `structural_tag`, `ignore_eos`, `skip_special_tokens`, "
    "`spaces_between_special_tokens`, `no_stop_trim`, `stream_interval`, `logit_bias`, "
    "`sampling_seed`, `custom_params`, `beam_width`, `watermark`, `choice`"
)


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            {"input_ids": [1], "sampling_params": {"max_new_token": 3}},
            f"unknown field `max_new_token`, expected one of {_SAMPLING_FIELDS}",
        ),
        ({"input_ids": [1], "priority": "high"}, 'invalid type: string "high", expected i64'),
        ({"input_ids": [1], "stream": "yes"}, 'invalid type: string "yes", expected a boolean'),
        ({"input_ids": ["a"]}, 'invalid type: string "a", expected a sequence'),
        ({"input_ids": [[1], "x"]}, 'invalid type: string "x", expected a sequence'),
        (
            {"input_ids": 7},
            "invalid type: integer `7`, expected a value or an array of values for TokenIdsOrList",
        ),
        ({"input_ids": [1.5]}, "invalid type: floating point `1.5`, expected i64"),
        (
            {"input_ids": [1], "rid": 5},
            "invalid type: integer `5`, expected a value or an array of values for StringOrList",
        ),
        ({"text": ["a", 1]}, "invalid type: integer `1`, expected a string"),
        (
            {"input_ids": [1], "sampling_params": {"temperature": "hot"}},
            'invalid type: string "hot", expected f64',
        ),
        (
            {"input_ids": [1], "sampling_params": {"ignore_eos": 1}},
            "invalid type: integer `1`, expected a boolean",
        ),
        (
            {"input_ids": [1], "sampling_params": {"stop_token_ids": [1.5]}},
            "invalid type: floating point `1.5`, expected i64",
        ),
        (
            {"input_ids": [1], "sampling_params": {"stop": ["a", 1]}},
            "invalid type: integer `1`, expected a string",
        ),
        (
            {"input_ids": [1], "sampling_params": {"logit_bias": [1]}},
            "invalid type: sequence, expected a map",
        ),
        (
            {"input_ids": [1], "sampling_params": {"watermark": 3}},
            "invalid type: integer `3`, expected struct WatermarkRequestConfig",
        ),
        (
            {"input_ids": [1], "sampling_params": "x"},
            'invalid type: string "x", expected a value or an array of values for '
            "SamplingParamsOrList",
        ),
        (
            {"input_ids": [1], "sampling_params": [{"bar": 2}]},
            f"unknown field `bar`, expected one of {_SAMPLING_FIELDS}",
        ),
        (
            {"input_ids": [[1]], "sampling_params": {"foo": 1}},
            f"unknown field `foo`, expected one of {_SAMPLING_FIELDS}",
        ),
        ([1, 2], "invalid type: sequence, expected struct GenerateRequest"),
    ],
)
def test_contract_errors_have_sglangs_texts(body: Any, error: str) -> None:
    with pytest.raises(ContractError) as caught:
        parse_generate_body(body)
    assert str(caught.value) == error


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "Either text, input_ids or input_embeds should be provided."),
        ({"text": "a", "input_ids": [1]}, "Either text, input_ids or input_embeds"),
        ({"input_ids": [[1], [2]]}, "Batch requests are not supported"),
        ({"text": ["a", "b"]}, "Batch requests are not supported"),
        ({"input_ids": []}, "must not be empty"),
        ({"input_ids": [-1]}, "token ids in [0, 2^63)"),
        (
            {"input_ids": [1], "sampling_params": {"max_new_tokens": -1}},
            "max_new_tokens must be at least 0",
        ),
        ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p must be in (0, 1]"),
        ({"input_ids": [1], "sampling_params": {"n": 2}}, "n > 1"),
    ],
)
def test_bad_input_that_keeps_the_contract_is_a_value_error(body: Any, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_generate_body(body)
    assert not isinstance(caught.value, ContractError)
    assert message in str(caught.value)


def test_a_valid_body_is_read_with_sglangs_defaults() -> None:
    parsed = parse_generate_body({"text": "Hi", "unknown_top_level_key": 1, "priority": 3})
    assert (parsed.text, parsed.input_ids, parsed.priority, parsed.stream) == ("Hi", None, 3, False)
    assert parsed.sampling.max_new_tokens == 128
    streamed = parse_generate_body(
        {"input_ids": [4, 5], "stream": True, "sampling_params": {"max_new_tokens": None}}
    )
    assert streamed.input_ids == [4, 5] and streamed.stream
    assert streamed.sampling.max_new_tokens is None  # SGLang: up to the context length
