// Package api is the router's HTTP front door: the OpenAI-compatible API
// (POST /v1/chat/completions, POST /v1/completions, GET /v1/models), plus
// /healthz, /readyz and /metrics. It authenticates the caller (tenants),
// decodes and validates the request strictly, bounds the tenant's requests
// in flight, hands a normalized Request to a Backend, and turns the tokens
// or the error that come back into OpenAI-shaped responses.
//
// # The seam
//
// Everything behind Backend (tokenization, chat templates, admission,
// pairing prefill with decode, the engine) is another package's job. The
// contract is in Backend and Stream: the handler calls Generate, then Next
// until io.EOF or an error, and always Close. The request context is
// cancelled when the client goes away. Errors are reqerr errors; ErrorFor
// maps them to statuses in one table.
//
// Stop sequences, the SSE framing, usage and logprobs formatting are done
// here on the text the backend returns, so a backend only generates.
//
// # Decoding rules
//
//   - The body is at most Config.MaxBodyBytes (413 otherwise), valid UTF-8
//     (400 otherwise: encoding/json would silently replace bad bytes), and
//     one JSON object. JSON escapes of lone surrogates (\ud800) decode to
//     U+FFFD, as encoding/json does.
//   - Every field is one of: supported (model, messages / prompt,
//     max_tokens, max_completion_tokens, temperature, top_p, seed, stop,
//     logprobs, top_logprobs, stream, stream_options.include_usage);
//     accepted at its neutral value only (n=1, best_of=1, echo=false,
//     suffix="", presence_penalty=0, frequency_penalty=0, logit_bias={},
//     tools=[], functions=[], tool_choice "none"/"auto",
//     response_format {"type":"text"}, modalities ["text"], store=false,
//     service_tier "auto"/"default", stream_options.include_obfuscation=false);
//     accepted and ignored because they cannot change the output (user,
//     safety_identifier, prompt_cache_key, metadata, parallel_tool_calls);
//     or unsupported (audio, function_call, prediction, reasoning_effort,
//     verbosity, web_search_options, and any neutral-only field at another
//     value): 400 unsupported_parameter naming it. null means absent.
//   - Any other top-level field is a 400 unknown_parameter naming it (the
//     first five, sorted): a typo like "max_token" must not be ignored.
//   - Types are strict: "5" is not an integer (integral numbers like 5.0
//     are). Ranges: max_tokens 1..Config.MaxTokensLimit and below the
//     model's context length; temperature 0..2; top_p 0..1; top_logprobs
//     0..20 (needs logprobs=true); completions logprobs 0..5; stop a string
//     or at most 4 non-empty strings.
//   - Chat messages: role system, developer (sent on as system), user or
//     assistant (tool and function: unsupported); content a string or an
//     array of {"type":"text","text":...} parts, joined; at least one message.
//   - Completions prompt: a non-empty string, or an array of exactly one.
//   - max_tokens absent: 16 for completions (OpenAI's default),
//     Config.DefaultChatMaxTokens for chat, below the context length, and
//     Request.MaxTokensAuto lets the backend lower it to what fits.
//
// # Errors
//
// Every error body is {"error":{"message","type","param","code"}}. Statuses
// are chosen only by ErrorFor (see its table). An error the backend reports
// before the first token gets its own status even when streaming: the 200
// and the SSE headers go out with the first token. After that, an error is
// one SSE event `data: {"error":{...}}` and the stream ends without
// `data: [DONE]`.
//
// # Authentication and limits
//
// With a key file, /v1 requests need `Authorization: Bearer KEY` (401
// otherwise); without one, every request is tenant "default". Each tenant
// has a limit on requests in flight (429 when reached).
//
// # Metrics
//
// kvfence_http_requests_total{endpoint,code}, kvfence_http_rejected_requests_total{reason},
// kvfence_http_requests_in_flight, kvfence_time_to_first_token_seconds,
// kvfence_inter_token_latency_seconds, kvfence_e2e_request_latency_seconds,
// kvfence_generation_tokens_total, kvfence_prompt_tokens_total. Label values
// come from fixed sets; tenant names never appear.
package api
