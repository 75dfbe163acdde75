"""Recognising context-window overflow errors by the providers' real wording.

Every provider case quotes an error as it was reported publicly; the source is cited
beside it. Cases marked "synthetic" are built from a wording, not copied from a report.
"""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.accounting.overflow_errors import (
    MAX_SCAN_CHARS,
    NOT_OVERFLOW,
    OverflowMatch,
    classify,
)

PROPERTY = settings(max_examples=300, deadline=None)


def body(**error: object) -> str:
    return json.dumps({"error": error})


def anthropic_body(message: str, kind: str = "invalid_request_error") -> str:
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}})


# (status, message, provider, requested_tokens, limit_tokens)
OVERFLOWS = [
    # ---- OpenAI ----
    pytest.param(
        400,
        # https://github.com/crewAIInc/crewAI-examples/issues/121
        body(
            message="This model's maximum context length is 8192 tokens. However, your "
            "messages resulted in 8227 tokens. Please reduce the length of the messages.",
            type="invalid_request_error",
            param="messages",
            code="context_length_exceeded",
        ),
        "openai",
        8227,
        8192,
        id="openai-messages-resulted-in",
    ),
    pytest.param(
        400,
        # https://github.com/mckaywrigley/chatbot-ui/issues/820 (completion counted in)
        body(
            message="This model's maximum context length is 8192 tokens. However, you "
            "requested 8554 tokens (7554 in the messages, 1000 in the completion). Please "
            "reduce the length of the messages or completion.",
            type="invalid_request_error",
            param="messages",
            code="context_length_exceeded",
        ),
        "openai",
        8554,
        8192,
        id="openai-you-requested",
    ),
    pytest.param(
        400,
        # https://github.com/FoundationAgents/OpenManus/issues/62 (comment by nerfani)
        body(
            message="This model's maximum context length is 8192 tokens. However, you "
            "requested 8213 tokens (6683 in the messages, 730 in the functions, and 800 in "
            "the completion). Please reduce the length of the messages, functions, or "
            "completion.",
            type="invalid_request_error",
            param="messages",
            code="context_length_exceeded",
        ),
        "openai",
        8213,
        8192,
        id="openai-with-functions",
    ),
    pytest.param(
        400,
        # https://github.com/bytedance/deer-flow/issues/721 (title); figures as in a
        # public report of the same error against gpt-5
        "openai.BadRequestError: Error code: 400 - {'error': {'message': 'Input tokens "
        "exceed the configured limit of 272000 tokens. Your messages resulted in 428548 "
        "tokens.', 'type': 'invalid_request_error', 'param': 'messages', 'code': "
        "'context_length_exceeded'}}",
        "openai",
        428548,
        272000,
        id="openai-configured-limit",
    ),
    pytest.param(
        None,
        # https://github.com/anomalyco/opencode/issues/6071 (Responses API stream error)
        json.dumps(
            {
                "type": "error",
                "sequence_number": 2,
                "error": {
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                    "message": "Your input exceeds the context window of this model. "
                    "Please adjust your input and try again.",
                    "param": "input",
                },
            }
        ),
        "openai",
        None,
        None,
        id="openai-responses-context-window",
    ),
    pytest.param(
        400,
        # https://github.com/tatsu-lab/stanford_alpaca/issues/47 (legacy completions; no
        # code in the text, so only "openai_compatible" can be said)
        "OpenAIError: This model's maximum context length is 4097 tokens, however you "
        "requested 4162 tokens (1090 in your prompt; 3072 for the completion). Please "
        "reduce your prompt; or completion length..",
        "openai_compatible",
        4162,
        4097,
        id="openai-legacy-completions",
    ),
    pytest.param(
        400,
        # synthetic: the brief's example, bare message with no code
        "This model's maximum context length is 8192 tokens. However, you requested 9000 "
        "tokens (8000 in the messages, 1000 in the completion). Please reduce the length "
        "of the messages or completion.",
        "openai_compatible",
        9000,
        8192,
        id="openai-bare-message",
    ),
    # ---- Azure OpenAI ----
    pytest.param(
        400,
        # https://github.com/microsoft/kernel-memory/issues/516 (Azure.RequestFailedException)
        "Azure.RequestFailedException: This model's maximum context length is 8192 tokens. "
        "However, your messages resulted in 10383 tokens. Please reduce the length of the "
        "messages. Status: 400 (model_error) ErrorCode: context_length_exceeded",
        "azure_openai",
        10383,
        8192,
        id="azure-request-failed",
    ),
    pytest.param(
        400,
        # https://github.com/Azure/azure-sdk-for-python/issues/40986 (azure-ai-inference)
        "(context_length_exceeded) This model's maximum context length is 128000 tokens. "
        "However, you requested 1124171 tokens (124171 in the messages, 1000000 in the "
        "completion). Please reduce the length of the messages or completion.\n"
        "Code: context_length_exceeded\nMessage: This model's maximum context length is "
        "128000 tokens.",
        "azure_openai",
        1124171,
        128000,
        id="azure-sdk-python",
    ),
    pytest.param(
        400,
        # https://github.com/Azure-Samples/azure-search-openai-demo/issues/1199: Azure's
        # body is OpenAI's, byte for byte, so it is attributed to "openai"
        "Error code: 400 - {'error': {'message': \"This model's maximum context length is "
        "4096 tokens. However, you requested 4201 tokens (3177 in the messages, 1024 in the "
        "completion). Please reduce the length of the messages or completion.\", 'type': "
        "'invalid_request_error', 'param': 'messages', 'code': 'context_length_exceeded'}}",
        "openai",
        4201,
        4096,
        id="azure-identical-to-openai",
    ),
    # ---- Anthropic ----
    pytest.param(
        400,
        # https://github.com/anthropics/claude-code/issues/12186
        '{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too '
        'long: 208310 tokens > 200000 maximum"},"request_id":"req_011CVQe1dLrGNMJyE1ghG1av"}',
        "anthropic",
        208310,
        200000,
        id="anthropic-prompt-too-long",
    ),
    pytest.param(
        400,
        # https://github.com/sojohnnysaid/project-guide/issues/2 (Python SDK repr)
        "anthropic.BadRequestError: Error code: 400 - {'type': 'error', 'error': {'type': "
        "'invalid_request_error', 'message': 'prompt is too long: 208656 tokens > 200000 "
        "maximum'}}",
        "anthropic",
        208656,
        200000,
        id="anthropic-prompt-too-long-repr",
    ),
    pytest.param(
        400,
        # https://github.com/docker/docker-agent/issues/569
        anthropic_body(
            "input length and `max_tokens` exceed context limit: 178959 + 64000 > 200000, "
            "decrease input length or `max_tokens` and try again"
        ),
        "anthropic",
        242959,
        200000,
        id="anthropic-input-and-max-tokens",
    ),
    pytest.param(
        400,
        # https://github.com/anthropics/claude-code/issues/228 (wrapped by the terminal)
        'API Error: 400 {"type":"error","error":{"type":"invalid_request_error","message":'
        '"input length and `max_tokens` exceed context limit: 184915 +\n20000 > 204648, '
        'decrease input length or `max_tokens` and try again"}}',
        "anthropic",
        204915,
        204648,
        id="anthropic-input-and-max-tokens-wrapped",
    ),
    pytest.param(
        413,
        # https://github.com/anthropics/claude-code/issues/6380
        anthropic_body("Request size exceeds model context window"),
        "anthropic",
        None,
        None,
        id="anthropic-413-context-window",
    ),
    pytest.param(
        413,
        # https://github.com/anthropics/claude-code/issues/10314 (32 MB request limit)
        '{"error":{"type":"request_too_large","message":"Request exceeds the maximum size"}}',
        "anthropic",
        None,
        None,
        id="anthropic-413-request-too-large",
    ),
    # ---- Google Gemini / Vertex AI ----
    pytest.param(
        400,
        # https://github.com/google-gemini/gemini-cli/issues/6678
        json.dumps(
            [
                {
                    "error": {
                        "code": 400,
                        "message": "The input token count (1200293) exceeds the maximum "
                        "number of tokens allowed (1048576).",
                        "errors": [
                            {
                                "message": "The input token count (1200293) exceeds the "
                                "maximum number of tokens allowed (1048576).",
                                "domain": "global",
                                "reason": "badRequest",
                            }
                        ],
                        "status": "INVALID_ARGUMENT",
                    }
                }
            ]
        ),
        "gemini",
        1200293,
        1048576,
        id="gemini-input-token-count",
    ),
    pytest.param(
        400,
        # https://github.com/google-gemini/gemini-cli/issues/4231 (JSON inside a JSON string)
        json.dumps(
            {
                "error": {
                    "message": json.dumps(
                        {
                            "error": {
                                "code": 400,
                                "message": "The input token count (3475108) exceeds the "
                                "maximum number of tokens allowed (1048576).",
                                "status": "INVALID_ARGUMENT",
                            }
                        },
                        indent=2,
                    ),
                    "code": 400,
                    "status": "Bad Request",
                }
            }
        ),
        "gemini",
        3475108,
        1048576,
        id="gemini-double-encoded",
    ),
    pytest.param(
        400,
        # https://github.com/arkavo-org/arkavo-edge/issues/371 (no count of the input)
        '{"error": {"code": 400, "message": "The input token count exceeds the maximum '
        'number of tokens allowed (1048576).", "status": "INVALID_ARGUMENT"}}',
        "gemini",
        None,
        1048576,
        id="gemini-without-input-count",
    ),
    pytest.param(
        400,
        # https://github.com/google-gemini/gemini-cli/issues/19727 (Vertex AI)
        "Failed to generate content: Unable to submit request because the input token count "
        "is 1251952 but model only supports up to 1048576. Reduce the input token count and "
        "try again.",
        "gemini",
        1251952,
        1048576,
        id="vertex-input-token-count",
    ),
    # ---- AWS Bedrock ----
    pytest.param(
        400,
        # https://github.com/aws-samples/bedrock-chat/issues/95
        "EventStreamError: An error occurred (validationException) when calling the "
        "InvokeModelWithResponseStream operation: Input is too long for requested model.",
        "bedrock",
        None,
        None,
        id="bedrock-input-too-long",
    ),
    pytest.param(
        400,
        # https://github.com/aws-samples/assessment-generator/issues/2
        '{"errorType": "ValidationException", "errorMessage": "Input is too long for '
        'requested model.", "name": "ValidationException", "$fault": "client"}',
        "bedrock",
        None,
        None,
        id="bedrock-input-too-long-json",
    ),
    pytest.param(
        400,
        # https://github.com/daisuke-awaji/moca/issues/254 (Converse relays Anthropic's text)
        "Type: ValidationException\nDetails: The model returned the following errors: "
        "prompt is too long: 200049 tokens > 200000 maximum",
        "bedrock",
        200049,
        200000,
        id="bedrock-converse-prompt-too-long",
    ),
    pytest.param(
        400,
        # quoted in a public Bedrock error-pattern table found by code search; no issue
        # thread with it was found
        "ValidationException: 400 Bad Request: Too many input tokens. Max input tokens: "
        "8192, request input token count: 9279 ",
        "bedrock",
        9279,
        8192,
        id="bedrock-too-many-input-tokens",
    ),
    pytest.param(
        400,
        # https://github.com/egoist/chatwise-releases/issues/917 (Bedrock behind OpenRouter)
        json.dumps(
            {
                "error": {
                    "message": "Provider returned error",
                    "code": 400,
                    "metadata": {
                        "raw": json.dumps(
                            {
                                "message": "input length and `max_tokens` exceed context "
                                "limit: 149674 + 64000 > 204658, decrease input length or "
                                "`max_tokens` and try again"
                            }
                        ),
                        "provider_name": "Amazon Bedrock",
                    },
                },
                "user_id": "user_2uqLSwEPUxV3eobBtagk2bR7nQw",
            }
        ),
        "bedrock",
        213674,
        204658,
        id="bedrock-via-openrouter",
    ),
    # ---- Mistral (wording documented at docs.mistral.ai/resources/known-limitations) ----
    pytest.param(
        400,
        # Mistral La Plateforme body, as captured in public provider tests (code search)
        '{"object":"error","message":"Prompt contains 40960 tokens and 0 draft tokens, too '
        'large for model with 32768 maximum context length","type":'
        '"invalid_request_message_error","param":null,"code":null}',
        "mistral",
        40960,
        32768,
        id="mistral-draft-tokens",
    ),
    pytest.param(
        400,
        # mistralai SDK error, as quoted in public code (code search)
        "mistralai.client.errors.sdkerror.SDKError: API error occurred: Status 400. Body: "
        '{"object":"error","message":"Prompt contains 159202 tokens and 0 draft tokens, too '
        'large for model with 131072 maximum context length","type":'
        '"invalid_request_invalid_args","param":null,"code":"3051","raw_status_code":400}',
        "mistral",
        159202,
        131072,
        id="mistral-sdk-error",
    ),
    pytest.param(
        400,
        # the wording without draft tokens, as quoted in public overflow detectors
        "Prompt contains 240000 tokens, too large for model with 128000 maximum context length",
        "mistral",
        240000,
        128000,
        id="mistral-no-draft-tokens",
    ),
    # ---- DeepSeek ----
    pytest.param(
        400,
        # https://github.com/evalstate/fast-agent/issues/621
        "Error code: 400 - {'error': {'message': \"This model's maximum context length is "
        "131072 tokens. However, you requested 131134 tokens (122942 in the messages, 8192 "
        'in the completion). Please reduce the length of the messages or completion.", '
        "'type': 'invalid_request_error', 'param': None, 'code': 'invalid_request_error'}}",
        "deepseek",
        131134,
        131072,
        id="deepseek-invalid-request-code",
    ),
    pytest.param(
        400,
        # https://github.com/FoundationAgents/OpenManus/issues/62
        "API error: Error code: 400 - {'error': {'message': \"This model's maximum context "
        "length is 65536 tokens. However, you requested 72814 tokens (68718 in the messages, "
        '4096 in the completion). Please reduce the length of the messages or completion.", '
        "'type': 'invalid_request_error', 'param': None, 'code': 'invalid_request_error'}}",
        "deepseek",
        72814,
        65536,
        id="deepseek-65536",
    ),
    # ---- OpenRouter ----
    pytest.param(
        400,
        # https://github.com/agno-agi/agno/issues/3980
        "This endpoint's maximum context length is 200000 tokens. However, you requested "
        "about 5028244 tokens (4945291 of text input, 2953 of tool input, 80000 in the "
        'output). Please reduce the length of either one, or use the "middle-out" transform '
        "to compress your prompt automatically.",
        "openrouter",
        5028244,
        200000,
        id="openrouter-about",
    ),
    pytest.param(
        400,
        # https://github.com/topoteretes/cognee/issues/1061
        '{"error":{"message":"This endpoint\'s maximum context length is 16384 tokens. '
        "However, you requested about 94307 tokens (94307 of text input). Please reduce the "
        'length of either one, or use the \\"middle-out\\" transform to compress your prompt '
        'automatically.","code":400,"metadata":{"provider_name":null}}}',
        "openrouter",
        94307,
        16384,
        id="openrouter-json",
    ),
    pytest.param(
        400,
        # https://github.com/OpenHands/OpenHands/issues/9937 (lower-cased by the client)
        "this endpoint's maximum context length is 131072 tokens. however, you requested "
        "about 138956 tokens (7884 of text input, 131072 in the output).",
        "openrouter",
        138956,
        131072,
        id="openrouter-lowercase",
    ),
    # ---- Ollama ----
    pytest.param(
        400,
        # https://github.com/n8n-io/n8n/issues/11144 (ollama server/routes.go, /api/embed)
        '{"error":"input length exceeds maximum context length"}',
        "ollama",
        None,
        None,
        id="ollama-input-length-maximum",
    ),
    pytest.param(
        400,
        # https://github.com/lfnovo/open-notebook/issues/350,
        # https://github.com/nano-step/nano-brain/issues/208
        'ollama: unexpected status 400: {"error":"the input length exceeds the context length"}',
        "ollama",
        None,
        None,
        id="ollama-input-length-context",
    ),
    pytest.param(
        400,
        # Ollama API wording quoted in several public overflow detectors (code search)
        '{"StatusCode":400,"Status":"400 Bad Request","error":"prompt too long; exceeded max '
        'context length by 4 tokens"}',
        "ollama",
        None,
        None,
        id="ollama-prompt-too-long",
    ),
    # ---- llama.cpp server ----
    pytest.param(
        400,
        # https://github.com/arbs-io/github-copilot-llm-gateway/issues/73
        '{"error":{"code":400,"message":"request (8708 tokens) exceeds the available context '
        'size (8192 tokens), try increasing it","type":"exceed_context_size_error",'
        '"n_prompt_tokens":8708,"n_ctx":8192}}',
        "llama_cpp",
        8708,
        8192,
        id="llama-cpp-exceed-context-size",
    ),
    pytest.param(
        500,
        # https://github.com/ggml-org/llama.cpp/pull/15780 (first version, sent as 500)
        '{"error":{"code":500,"message":"the request exceeds the available context size. try '
        'increasing the context size or enable context shift","type":'
        '"exceed_context_size_error","n_prompt_tokens":1407,"n_ctx":256}}',
        "llama_cpp",
        1407,
        256,
        id="llama-cpp-500-context-shift",
    ),
    pytest.param(
        400,
        # https://github.com/llmmllab/llmmllab-api/issues/69 (Python repr: not JSON)
        "Error code: 400 - {'error': {'code': 400, 'message': 'request (25837 tokens) "
        "exceeds the available context size (25088 tokens), try increasing it', 'type': "
        "'exceed_context_size_error', 'n_prompt_tokens': 25837, 'n_ctx': 25088}}",
        "llama_cpp",
        25837,
        25088,
        id="llama-cpp-repr",
    ),
    pytest.param(
        400,
        # synthetic: the brief's wording with the fields in JSON
        '{"error":{"code":400,"message":"the request exceeds the available context size, try '
        'increasing it","type":"exceed_context_size_error","n_prompt_tokens":20512,'
        '"n_ctx":16384}}',
        "llama_cpp",
        20512,
        16384,
        id="llama-cpp-fields-only",
    ),
    pytest.param(
        500,
        # https://github.com/ggml-org/llama.cpp/issues/11105 (older servers)
        '{"error":{"code":500,"message":"input is too large to process. increase the physical '
        'batch size","type":"server_error"}}',
        "llama_cpp",
        None,
        None,
        id="llama-cpp-physical-batch",
    ),
    # ---- vLLM ----
    pytest.param(
        400,
        # https://github.com/vllm-project/vllm/issues/20409
        "Error code: 400 - {'object': 'error', 'message': \"This model's maximum context "
        "length is 16384 tokens. However, you requested 19591 tokens (9591 in the messages, "
        "10000 in the completion). Please reduce the length of the messages or completion. "
        "None\", 'type': 'BadRequestError', 'param': None, 'code': 400}",
        "vllm",
        19591,
        16384,
        id="vllm-you-requested",
    ),
    pytest.param(
        400,
        # https://github.com/vllm-project/vllm/pull/33425 (newer wording, "Previously:")
        '{"error":{"message":"This model\'s maximum context length is 3 tokens. However, your '
        "request has 8 input tokens. Please reduce the length of the input messages. "
        '(parameter=input_tokens, value=8)","type":"BadRequestError","param":"input_tokens",'
        '"code":400}}',
        "vllm",
        8,
        3,
        id="vllm-request-has-input-tokens",
    ),
    pytest.param(
        400,
        # https://github.com/claude-code-best/claude-code/issues/272: input plus reserved
        # output exceed the window, so it is an overflow; requested is their sum
        "Error: 400 'max_tokens' or 'max_completion_tokens' is too large: 64000. This "
        "model's maximum context length is 64001 tokens and your request has 24235 input "
        "tokens (64000 > 64001 - 24235). None",
        "vllm",
        88235,
        64001,
        id="vllm-max-tokens-exceed-context",
    ),
    pytest.param(
        400,
        # https://github.com/vllm-project/vllm/issues/12165
        "ValueError: The prompt (total length 25938) is too long to fit into the model "
        "(context length 4096). Make sure that `max_model_len` is no smaller than the number "
        "of text tokens plus multimodal tokens.",
        "vllm",
        25938,
        4096,
        id="vllm-too-long-to-fit",
    ),
    # ---- xAI ----
    pytest.param(
        400,
        # https://github.com/cline/cline/issues/3120
        "This model's maximum prompt length is 131072 but the request contains 136973 tokens.",
        "xai",
        136973,
        131072,
        id="xai-maximum-prompt-length",
    ),
    # ---- Groq ----
    pytest.param(
        400,
        # https://github.com/OpenHands/OpenHands/issues/1902 (Groq through LiteLLM)
        "GroqException - Error code: 400 - {'error': {'message': 'Please reduce the length of "
        "the messages or completion.', 'type': 'invalid_request_error', 'param': 'messages', "
        "'code': 'context_length_exceeded'}}",
        "groq",
        None,
        None,
        id="groq-reduce-length",
    ),
    pytest.param(
        400,
        # earendil-works/pi packages/ai/src/utils/overflow.ts (Groq: the message alone)
        "Please reduce the length of the messages or completion",
        "groq",
        None,
        None,
        id="groq-message-only",
    ),
    # ---- Cerebras ----
    pytest.param(
        400,
        # BerriAI/litellm tests/test_litellm/litellm_core_utils/test_exception_mapping_utils.py
        "CerebrasException - Please reduce the length of the messages or completion. Current "
        "length is 50000 while limit is 40000",
        "cerebras",
        50000,
        40000,
        id="cerebras-current-length",
    ),
    pytest.param(
        400,
        # BerriAI/litellm tests/test_litellm/litellm_core_utils/test_exception_mapping_utils.py
        "Current length is 132784 while limit is 131000",
        "cerebras",
        132784,
        131000,
        id="cerebras-current-length-only",
    ),
    # ---- SGLang (Together AI relays the same sentence) ----
    pytest.param(
        400,
        # earendil-works/pi packages/ai/test/overflow.test.ts ("Together AI"); the sentence
        # is raised by sgl-project/sglang python/sglang/srt/managers/tokenizer_manager.py
        "400 The input (516368 tokens) is longer than the model's context length (262144 tokens).",
        "sglang",
        516368,
        262144,
        id="together-input-longer-than-context",
    ),
    pytest.param(
        400,
        # synthetic figures in the wording of sgl-project/sglang
        # python/sglang/srt/managers/tokenizer_manager.py (_validate_one_request), inside
        # its OpenAI-style error object
        '{"object":"error","message":"The input (43028 tokens) is longer than the model\'s '
        'context length (40960 tokens).","type":"BadRequestError","param":null,"code":400}',
        "sglang",
        43028,
        40960,
        id="sglang-input-longer-than-context-json",
    ),
    pytest.param(
        503,
        # earendil-works/pi packages/ai/test/overflow.test.ts (relayed by LiteLLM as a 503)
        "Error: 503 litellm.ServiceUnavailableError: litellm.MidStreamFallbackError: "
        "litellm.APIConnectionError: APIConnectionError: OpenAIException - Requested token "
        "count exceeds the model's maximum context length of 131072 tokens.",
        "sglang",
        None,
        131072,
        id="sglang-requested-token-count-via-litellm",
    ),
    pytest.param(
        400,
        # synthetic figures in the wording of sgl-project/sglang
        # python/sglang/srt/managers/tokenizer_manager.py (input + max_new_tokens)
        "Requested token count exceeds the model's maximum context length of 32768 tokens. "
        "You requested a total of 40000 tokens: 36000 tokens from the input messages and 4000 "
        "tokens for the completion. Please reduce the number of tokens in the input messages "
        "or the completion to fit within the limit.",
        "sglang",
        40000,
        32768,
        id="sglang-requested-total",
    ),
    # ---- OpenRouter relaying a provider ----
    pytest.param(
        400,
        # earendil-works/pi packages/ai/test/overflow.test.ts (OpenRouter / Poolside)
        "Provider returned error: Input length 131393 exceeds the maximum allowed input length "
        "of 131040 tokens.",
        "openrouter",
        131393,
        131040,
        id="openrouter-maximum-allowed-input-length",
    ),
    pytest.param(
        400,
        # earendil-works/pi packages/ai/test/overflow.test.ts (OpenAI-compatible servers)
        "Error: 400 Input length (265330) exceeds model's maximum context length (262144).",
        None,
        265330,
        262144,
        id="openai-compatible-input-length-parenthesised",
    ),
    # ---- Amazon Bedrock Mantle ----
    pytest.param(
        400,
        # earendil-works/pi packages/ai/test/overflow.test.ts
        "Amazon Bedrock Mantle OpenAI Responses API error (400): invalid_prompt: prompt tokens "
        "(330095) exceed model maximum (278528) for base model abc",
        "bedrock",
        330095,
        278528,
        id="bedrock-mantle-prompt-tokens",
    ),
    pytest.param(
        400,
        # openai/codex codex-rs test prompt_token_limit_errors_are_context_window_errors
        # (found by code search; its file path was not resolved)
        "prompt tokens (483166) exceed customer model maximum (278528) for "
        "7903dfda-4910-4bc7-86ca-ea247ecf6bd2",
        "bedrock",
        483166,
        278528,
        id="bedrock-mantle-customer-model",
    ),
    # ---- MiniMax ----
    pytest.param(
        400,
        # https://github.com/MiniMax-AI/MiniMax-M2/issues/119; "(2013)" is MiniMax's error
        # code, so no sizes are read
        "invalid params, context window exceeds limit (2013)",
        "minimax",
        None,
        None,
        id="minimax-context-window-exceeds-limit",
    ),
    pytest.param(
        400,
        # https://github.com/NousResearch/hermes-agent/pull/14743 (the Anthropic-compatible
        # endpoint); the error object as captured in public code (code search)
        json.dumps(
            {
                "type": "error",
                "error": {
                    "type": "bad_request_error",
                    "message": "invalid params, context window exceeds limit (2013)",
                    "http_code": "400",
                },
            }
        ),
        "minimax",
        None,
        None,
        id="minimax-wrapped-with-error-code",
    ),
    # ---- Kimi / Moonshot ----
    pytest.param(
        400,
        # https://github.com/MoonshotAI/kimi-cli/issues/2011 (the terminal's line break in
        # "requested" removed)
        "Error code: 400 - {'error': {'message': 'Invalid request: Your request exceeded model "
        "token limit: 262144 (requested: 269030)', 'type': 'invalid_request_error'}}",
        "moonshot",
        269030,
        262144,
        id="kimi-exceeded-model-token-limit",
    ),
    # ---- GitHub Copilot ----
    pytest.param(
        400,
        # https://github.com/microsoft/vscode/issues/289219
        '{"error":{"message":"prompt token count of 1236658 exceeds the limit of 128000",'
        '"code":"model_max_prompt_tokens_exceeded"}}',
        "github_copilot",
        1236658,
        128000,
        id="copilot-prompt-token-count",
    ),
    pytest.param(
        400,
        # https://github.com/microsoft/vscode-copilot-release/issues/6700 (no code)
        '{"error":{"message":"prompt token count of 65446 exceeds the limit of 64000","param":'
        '"","code":"","type":""}}',
        "github_copilot",
        65446,
        64000,
        id="copilot-prompt-token-count-no-code",
    ),
    # ---- LM Studio ----
    pytest.param(
        400,
        # https://github.com/tinyhumansai/openhuman/issues/3550
        "The number of tokens to keep from the initial prompt is greater than the context "
        "length (n_keep: 10247 >= n_ctx: 4096). Try to load the model with a larger context "
        "length, or provide a shorter prompt.",
        "lm_studio",
        10247,
        4096,
        id="lm-studio-tokens-to-keep",
    ),
    pytest.param(
        400,
        # earendil-works/pi packages/ai/src/utils/overflow.ts (LM Studio, the phrase alone)
        "tokens to keep from the initial prompt is greater than the context length",
        "lm_studio",
        None,
        None,
        id="lm-studio-tokens-to-keep-phrase",
    ),
    pytest.param(
        400,
        # https://github.com/anomalyco/opencode/issues/11141
        "Cannot truncate prompt with n_keep (15028) >= n_ctx (7424)",
        "lm_studio",
        15028,
        7424,
        id="lm-studio-cannot-truncate",
    ),
    pytest.param(
        400,
        # https://github.com/lmstudio-ai/lmstudio-bug-tracker/issues/546
        "Trying to keep the first 111490 tokens when context the overflows. However, the model "
        "is loaded with context length of only 32768 tokens, which is not enough. Try to load "
        "the model with a larger context length, or provide a shorter input.",
        "lm_studio",
        111490,
        32768,
        id="lm-studio-keep-first-tokens",
    ),
    # ---- Hugging Face TGI ----
    pytest.param(
        400,
        # BerriAI/litellm tests/test_litellm/litellm_core_utils/test_exception_mapping_utils.py
        "`inputs` tokens + `max_new_tokens` must be <= 4096",
        "huggingface_tgi",
        None,
        4096,
        id="tgi-inputs-plus-max-new-tokens",
    ),
    pytest.param(
        422,
        # synthetic figures in huggingface/text-generation-inference router/src/validation.rs
        # (ValidationError::MaxTotalTokens)
        "`inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and "
        "512 `max_new_tokens`",
        "huggingface_tgi",
        4512,
        4096,
        id="tgi-inputs-plus-max-new-tokens-given",
    ),
    pytest.param(
        422,
        # synthetic figures in huggingface/text-generation-inference router/src/validation.rs
        # (ValidationError::InputLength)
        "`inputs` must have less than 4096 tokens. Given: 5000",
        "huggingface_tgi",
        5000,
        4096,
        id="tgi-inputs-too-long",
    ),
    # ---- DS4 server (llama.cpp-style) ----
    pytest.param(
        400,
        # https://github.com/earendil-works/pi/issues/6262
        "400 Prompt has 256468 tokens, but the configured context size is 256000 tokens",
        "ds4",
        256468,
        256000,
        id="ds4-configured-context-size",
    ),
    pytest.param(
        400,
        # https://github.com/earendil-works/pi/issues/6262 (thousands separators)
        "Prompt has 5,958,968 tokens, but the configured context size is 256,000 tokens",
        "ds4",
        5958968,
        256000,
        id="ds4-configured-context-size-separators",
    ),
    # ---- A bare HTTP 413 ----
    pytest.param(
        413,
        # anomalyco/opencode packages/opencode/src/provider/error.ts: any 413 is an overflow
        "",
        None,
        None,
        None,
        id="http-413-empty-body",
    ),
    pytest.param(
        None,
        # earendil-works/pi packages/ai/src/utils/overflow.ts: Cerebras answers "413 status
        # code (no body)" (the OpenAI SDK's text for a bodiless 413)
        "413 status code (no body)",
        None,
        None,
        None,
        id="http-413-no-body-text",
    ),
    pytest.param(
        None,
        # anomalyco/opencode packages/opencode/src/provider/error.ts ("request entity too
        # large", HTTP 413's reason phrase)
        "Request Entity Too Large",
        None,
        None,
        None,
        id="http-413-reason-phrase",
    ),
    pytest.param(
        413,
        # synthetic: a gateway's generic body for the status
        '{"message":"Payload Too Large"}',
        None,
        None,
        None,
        id="http-413-generic-body",
    ),
    # ---- Generic ----
    pytest.param(
        400,
        # https://github.com/langgenius/dify/issues/32221 (Volcano Engine Ark)
        "Error code: 400 - {'error': {'code': 'InvalidParameter', 'message': 'Input length "
        "203743 exceeds the maximum length 202752'}}",
        None,
        203743,
        202752,
        id="generic-input-length-maximum-length",
    ),
    pytest.param(
        400,
        # BerriAI/litellm tests/test_litellm/litellm_core_utils/test_exception_mapping_utils.py
        "Your prompt is longer than the model's context length of 2048.",
        None,
        None,
        None,
        id="generic-longer-than-context-length",
    ),
    pytest.param(
        400,
        # https://github.com/rllm-team/rllm/issues/55 (llama-cpp-python)
        "ValueError: Requested tokens (516) exceed context window of 512",
        None,
        None,
        None,
        id="generic-exceed-context-window",
    ),
    pytest.param(
        400,
        # synthetic: generic phrasing used by gateways
        "OutofContextError: context length exceeded",
        None,
        None,
        None,
        id="generic-context-length-exceeded",
    ),
    pytest.param(
        400,
        # synthetic: OpenAI's code without any known message
        '{"error":{"code":"context_length_exceeded","message":"too long"}}',
        "openai",
        None,
        None,
        id="generic-code-only",
    ),
    pytest.param(
        413,
        # synthetic: a proxy in front of the model rejecting the body
        "<html><head><title>413 Request Entity Too Large</title></head></html>",
        None,
        None,
        None,
        id="generic-http-413",
    ),
]


@pytest.mark.parametrize(("status", "message", "provider", "requested", "limit"), OVERFLOWS)
def test_recognises_real_overflow_wordings(
    status: int | None, message: str, provider: str | None, requested: int | None, limit: int | None
) -> None:
    found = classify(status, message)

    assert found.overflow
    assert found.provider == provider
    assert found.pattern
    assert (found.requested_tokens, found.limit_tokens) == (requested, limit)


@pytest.mark.parametrize(("status", "message", "provider", "requested", "limit"), OVERFLOWS)
def test_wording_is_matched_whatever_the_case(
    status: int | None, message: str, provider: str | None, requested: int | None, limit: int | None
) -> None:
    found = classify(status, message.upper())

    assert (found.overflow, found.provider) == (True, provider)
    assert (found.requested_tokens, found.limit_tokens) == (requested, limit)


def test_requested_exceeds_limit_whenever_both_are_stated() -> None:
    for case in OVERFLOWS:
        status, message, *_ = case.values
        assert isinstance(message, str)
        found = classify(status if isinstance(status, int) else None, message)
        if found.requested_tokens is not None and found.limit_tokens is not None:
            assert found.requested_tokens > found.limit_tokens, case.id


@pytest.mark.parametrize(
    ("message", "requested", "limit"),
    [
        ("prompt is too long: 242,201 tokens > 200,000 maximum", 242_201, 200_000),
        (
            "The input token count (1,200,000) exceeds the maximum number of tokens allowed "
            "(1,048,576).",
            1_200_000,
            1_048_576,
        ),
        (
            "This model's maximum context length is 128,000 tokens. However, your messages "
            "resulted in 131,074 tokens.",
            131_074,
            128_000,
        ),
        ("prompt token count of 1,236,658 exceeds the limit of 128,000", 1_236_658, 128_000),
        (
            "Your request exceeded model token limit: 262,144 (requested: 269,030)",
            269_030,
            262_144,
        ),
        (
            "Please reduce the length of the messages or completion. Current length is 202,427 "
            "while limit is 131,072",
            202_427,
            131_072,
        ),
        (
            "The input (1,048,577 tokens) is longer than the model's context length (1,048,576 "
            "tokens).",
            1_048_577,
            1_048_576,
        ),
        ("prompt tokens (1,416,135) exceed model maximum (1,050,000) for x", 1_416_135, 1_050_000),
        (
            "Input length 131,393 exceeds the maximum allowed input length of 131,040 tokens.",
            131_393,
            131_040,
        ),
        (
            "The number of tokens to keep from the initial prompt is greater than the context "
            "length (n_keep: 10,247 >= n_ctx: 4,096).",
            10_247,
            4_096,
        ),
        (
            "`inputs` tokens + `max_new_tokens` must be <= 4,096. Given: 4,000 `inputs` tokens "
            "and 512 `max_new_tokens`",
            4_512,
            4_096,
        ),
    ],
)
def test_numbers_may_carry_thousands_separators(message: str, requested: int, limit: int) -> None:
    found = classify(400, message)

    assert (found.overflow, found.requested_tokens, found.limit_tokens) == (True, requested, limit)


NOT_OVERFLOWS = [
    pytest.param(
        429,
        # https://github.com/DrShushen/climb/issues/13
        "RateLimitError: Error code: 429 - {'error': {'message': 'Request too large for "
        "gpt-4o in organization org-VDAWofJASuLH0vVz8o9tiQZr on tokens per min (TPM): Limit "
        "30000, Requested 30601. The input or output tokens must be reduced in order to run "
        "successfully. Visit https://platform.openai.com/account/rate-limits to learn "
        "more.', 'type': 'tokens', 'param': None, 'code': 'rate_limit_exceeded'}}",
        id="openai-429-request-too-large-tpm",
    ),
    pytest.param(
        None,
        # https://github.com/continuedev/continue/issues/10602 (no status: the text decides)
        "429 Request too large for gpt-4o in organization org-vyUrKHsIdLcZGKR3zqCqllrS on "
        "tokens per min (TPM): Limit 30000, Requested 61337. The input or output tokens must "
        "be reduced in order to run successfully.",
        id="openai-tpm-without-status",
    ),
    pytest.param(
        429,
        # https://github.com/BuilderIO/micro-agent/issues/86
        "429 Rate limit reached for gpt-4o in organization org-uOtiSEwvUnroadaOnJJquBEC on "
        "tokens per min (TPM): Limit 30000, Used 29937, Requested 385. Please try again in "
        "644ms.",
        id="openai-429-rate-limit-reached",
    ),
    pytest.param(
        413,
        # https://github.com/continuedev/continue/issues/10218 (Groq sends TPM as 413)
        "413 Request too large for model `llama-3.3-70b-versatile` in organization "
        "`org_01kgg5588eftc8k70aes4864eb` service tier `on_demand` on tokens per minute "
        "(TPM): Limit 12000, Requested 14137, please reduce your message size and try again.",
        id="groq-413-tpm",
    ),
    pytest.param(
        400,
        # https://github.com/ChatGPTNextWeb/NextChat/issues/3195 (an output cap)
        body(
            message="max_tokens is too large: 8192. This model supports at most 4096 "
            "completion tokens, whereas you provided 8192.",
            type="invalid_request_error",
            param="max_tokens",
            code=None,
        ),
        id="openai-max-tokens-too-large",
    ),
    pytest.param(
        400,
        # synthetic: the brief's example of the same output cap
        "max_tokens is too large: 5000. This model supports at most 4096 completion tokens",
        id="openai-max-tokens-too-large-bare",
    ),
    pytest.param(
        400,
        # https://github.com/anthropics/claude-code/issues/24451 (an output cap)
        anthropic_body(
            "max_tokens: 128001 > 64000, which is the maximum allowed number of output tokens "
            "for claude-opus-4-5-20251101"
        ),
        id="anthropic-max-tokens-output-cap",
    ),
    pytest.param(
        400,
        # https://github.com/charmbracelet/crush/issues/946 (an output cap)
        '{"message":"The maximum tokens you requested exceeds the model limit of 32768"}',
        id="bedrock-max-tokens-output-cap",
    ),
    pytest.param(
        401,
        # synthetic: OpenAI's invalid key body
        body(
            message="Incorrect API key provided: sk-abc. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            type="invalid_request_error",
            param=None,
            code="invalid_api_key",
        ),
        id="openai-401",
    ),
    pytest.param(
        401,
        # synthetic: Anthropic's authentication error shape
        anthropic_body("invalid x-api-key", kind="authentication_error"),
        id="anthropic-401",
    ),
    pytest.param(
        400,
        # synthetic: a different invalid_request_error
        body(
            message="The model `gpt-9` does not exist or you do not have access to it.",
            type="invalid_request_error",
            param=None,
            code="model_not_found",
        ),
        id="openai-model-not-found",
    ),
    pytest.param(
        500,
        # synthetic: OpenAI's generic server error
        body(
            message="The server had an error while processing your request. Sorry about that!",
            type="server_error",
        ),
        id="openai-500",
    ),
    pytest.param(500, "Internal Server Error", id="plain-500"),
    pytest.param(
        529,
        # synthetic: Anthropic's overloaded error shape
        anthropic_body("Overloaded", kind="overloaded_error"),
        id="anthropic-529",
    ),
    pytest.param(
        400,
        # openai/codex codex-rs test malformed_prompt_token_limit_errors_remain_invalid_requests
        # (found by code search): the Mantle wording without a count is not read as one
        "prompt tokens (many) exceed model maximum (278528) for openai.gpt-5.6-sol",
        id="near-miss-mantle-without-count",
    ),
    pytest.param(
        429,
        # earendil-works/pi packages/ai/test/context-overflow.test.ts: Cerebras's token rate
        # limit comes as "429 status code (no body)"
        "429 status code (no body)",
        id="cerebras-429-no-body",
    ),
    pytest.param(
        400,
        # earendil-works/pi and anomalyco/opencode count a bodiless 400 as Cerebras's or
        # Mistral's overflow; a 400 that says nothing is any bad request, so it is not one
        "400 status code (no body)",
        id="400-no-body",
    ),
    pytest.param(
        None,
        # earendil-works/pi packages/ai/test/overflow.test.ts (Bedrock throttling)
        "Throttling error: Too many tokens, please wait before trying again.",
        id="bedrock-throttling-too-many-tokens",
    ),
    pytest.param(
        None,
        # earendil-works/pi packages/ai/test/overflow.test.ts
        "Service unavailable: The service is temporarily unavailable.",
        id="bedrock-service-unavailable",
    ),
    pytest.param(
        None,
        # earendil-works/pi packages/ai/test/overflow.test.ts
        "Rate limit exceeded, please retry after 30 seconds.",
        id="generic-rate-limit",
    ),
    pytest.param(
        None,
        # earendil-works/pi packages/ai/test/overflow.test.ts
        "Too many requests. Please slow down.",
        id="generic-too-many-requests",
    ),
    pytest.param(
        500,
        # earendil-works/pi packages/ai/test/overflow.test.ts (Ollama)
        "500 `model runner crashed unexpectedly`",
        id="ollama-runner-crashed",
    ),
    pytest.param(
        400,
        # BerriAI/litellm tests/test_litellm/litellm_core_utils/test_exception_mapping_utils.py
        # (a "length" that is not the prompt's)
        "Invalid 'user': string too long. Expected a string with maximum length 64, but got a "
        "string with length 123 instead.",
        id="near-miss-user-string-too-long",
    ),
    pytest.param(
        400,
        # BerriAI/litellm tests/test_litellm/litellm_core_utils/test_exception_mapping_utils.py
        '{"error": {"message": "Invalid \'user\': string too long.", "code": '
        '"string_above_max_length"}}',
        id="near-miss-string-above-max-length",
    ),
    pytest.param(
        None,
        # BerriAI/litellm tests/test_litellm/litellm_core_utils/test_exception_mapping_utils.py
        "The context is large, but acceptable.",
        id="near-miss-context-is-large",
    ),
    pytest.param(
        400,
        # openai/codex codex-rs/core/src/api_bridge_tests.rs (a byte limit, near "exceeds the
        # limit of")
        "Total image data in 'input' exceeds the 536870912 byte limit.",
        id="near-miss-image-byte-limit",
    ),
    pytest.param(
        400,
        # openai/codex codex-rs/core/src/api_bridge_tests.rs (an image count)
        "This request contains 1501 images, which exceeds the 1500 image limit for a single "
        "Responses API request.",
        id="near-miss-image-count-limit",
    ),
    pytest.param(
        422,
        # synthetic figures in huggingface/text-generation-inference router/src/validation.rs
        # (ValidationError::MaxNewTokens): an output cap
        "Input validation error: `max_new_tokens` must be <= 4096. Given: 8192",
        id="tgi-max-new-tokens-output-cap",
    ),
    pytest.param(
        400,
        # TGI's total-tokens error where max_new_tokens alone fills the window, as captured in
        # public code (code search): no compaction can make it fit, so it is an output cap
        '{"error":{"message":"Input validation error: `inputs` tokens + `max_new_tokens` must '
        'be <= 32769. Given: 30 `inputs` tokens and 999999999 `max_new_tokens`","type":'
        '"invalid_request_error"}}',
        id="tgi-total-with-output-over-the-window",
    ),
    pytest.param(
        400,
        # synthetic figures in the wording of sgl-project/sglang
        # python/sglang/srt/managers/tokenizer_manager.py: the completion alone is over
        "Requested token count exceeds the model's maximum context length of 32768 tokens. "
        "You requested a total of 40000 tokens: 100 tokens from the input messages and 39900 "
        "tokens for the completion.",
        id="sglang-total-with-output-over-the-window",
    ),
    pytest.param(
        400,
        # https://github.com/docker/docker-agent/issues/569's wording with synthetic figures:
        # max_tokens alone is over the window
        anthropic_body(
            "input length and `max_tokens` exceed context limit: 1000 + 250000 > 200000, "
            "decrease input length or `max_tokens` and try again"
        ),
        id="anthropic-max-tokens-over-the-window",
    ),
    pytest.param(
        400,
        # MiniMax's error 2013 for an oversize image, as quoted in public code (code search):
        # near "exceeds limit (2013)", but not the context window
        '{"error":{"message":"media exceeds size limit: max 10485760 bytes (2013)","code":'
        '"invalid_prompt"}}',
        id="near-miss-minimax-media-size",
    ),
    pytest.param(400, "", id="empty"),
    pytest.param(None, "   \n\t ", id="whitespace"),
    pytest.param(400, "null", id="json-null"),
    pytest.param(400, "{}", id="json-empty-object"),
    pytest.param(400, '{"error": {"n_ctx": 4096, "n_prompt_tokens": 10}}', id="fields-only"),
    pytest.param(None, "\x00\ufffd\U0001f600 }{][ ::: 4096 > 2048 ,,, \\u0000", id="garbage"),
]


@pytest.mark.parametrize(("status", "message"), NOT_OVERFLOWS)
def test_other_errors_are_not_overflows(status: int | None, message: str) -> None:
    assert classify(status, message) == NOT_OVERFLOW


def test_a_rate_limit_status_wins_over_overflow_wording() -> None:
    message = anthropic_body("prompt is too long: 208310 tokens > 200000 maximum")

    assert classify(400, message).overflow
    assert classify(429, message) == NOT_OVERFLOW


def test_a_long_body_is_scanned_only_at_its_start() -> None:
    overflow = "prompt is too long: 208310 tokens > 200000 maximum"

    assert classify(400, overflow + " " * 5_000_000).overflow
    assert classify(400, " " * MAX_SCAN_CHARS + overflow) == NOT_OVERFLOW


@pytest.mark.parametrize(
    "message",
    [
        pytest.param("x" * 5_000_000, id="letters"),
        pytest.param("9" * 5_000_000, id="digits"),
        pytest.param("1," * 2_500_000, id="separated-digits"),
        pytest.param("maximum context length is 1 tokens " * 150_000, id="near-miss-repeated"),
        pytest.param("prompt contains 1 tokens and " * 200_000, id="unfinished-mistral"),
        pytest.param('{"error": "' + "a" * 5_000_000 + '"}', id="huge-json"),
        pytest.param('{"a":' * 20_000 + "1" + "}" * 20_000, id="deep-json-object"),
        pytest.param("[" * 200_000, id="deep-json-array"),
    ],
)
def test_huge_and_adversarial_bodies_are_classified_quickly(message: str) -> None:
    started = time.perf_counter()
    found = classify(400, message)
    elapsed = time.perf_counter() - started

    assert isinstance(found, OverflowMatch)
    assert elapsed < 1.0, f"{elapsed:.2f}s"


@PROPERTY
@given(st.one_of(st.none(), st.integers()), st.text())
def test_never_raises_on_arbitrary_text(status: int | None, message: str) -> None:
    found = classify(status, message)

    assert isinstance(found, OverflowMatch)
    if not found.overflow:
        assert found == NOT_OVERFLOW


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["error", "message", "code", "type", "n_ctx", "n_prompt_tokens"])
            | st.text(max_size=8),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@PROPERTY
@given(st.one_of(st.none(), st.integers(100, 599)), JSON_VALUES)
def test_never_raises_on_arbitrary_json_bodies(status: int | None, value: object) -> None:
    found = classify(status, json.dumps(value))

    assert isinstance(found, OverflowMatch)
    for count in (found.requested_tokens, found.limit_tokens):
        assert count is None or count >= 0


NOISE = st.text(alphabet=" \t\n{}[]():;,.=-_|#0123456789", max_size=60)
OVERFLOW_CASES = st.sampled_from([case.values for case in OVERFLOWS])


@PROPERTY
@given(OVERFLOW_CASES, NOISE, NOISE)
def test_overflow_is_found_inside_surrounding_noise(
    case: tuple[object, ...], before: str, after: str
) -> None:
    status, message, provider, requested, limit = case
    assert status is None or isinstance(status, int)
    assert isinstance(message, str)

    found = classify(status, f"{before} {message} {after}")

    assert (found.overflow, found.provider) == (True, provider)
    assert (found.requested_tokens, found.limit_tokens) == (requested, limit)
