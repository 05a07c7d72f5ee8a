package reqtext

// DefaultCompletionsMaxTokens is the output limit vLLM (like OpenAI)
// gives a /v1/completions request that sets no max_tokens.
const DefaultCompletionsMaxTokens = 16

// DefaultMaxTokens is the output limit the engine gives a request of kind
// that sets none, where that limit is short enough to weigh the request
// by; 0 where it is not: a chat runs to the end of the context (vLLM),
// and /generate's default depends on the server behind it (SGLang,
// TGI, Triton).
func DefaultMaxTokens(kind string) int {
	if kind == KindCompletions {
		return DefaultCompletionsMaxTokens
	}
	return 0
}
