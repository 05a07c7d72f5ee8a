package kvevents

import (
	"hash/fnv"
	"regexp"
)

// Tokenizer gives the token ids an engine sees for a request's prompt, so
// Sluice can key it the way the index keys the engine's blocks. ok is
// false when it cannot (the index is then not consulted for the request).
type Tokenizer interface {
	Tokenize(model, text string) (tokens []uint32, ok bool)
}

// SimTokenizer is llm-d-inference-sim's dummy tokenizer rule (its
// --force-dummy-tokenizer, or a model it has no tokenizer for): words and
// single punctuation characters, each with the whitespace after it, as
// FNV-32a ids. Exact for /v1/completions prompts; the sim renders chat
// messages with its own separators, which Sluice's prompt text does not
// reproduce, so chat prompts match only where they render the same.
type SimTokenizer struct{}

var simTokenRE = regexp.MustCompile(`(\{|\}|:|,|-|\.|\?|\!|;|@|#|\$|%|\^|&|\*|\(|\)|\+|\-|_|~|/|\\|>|<|\[|\]|=|"|'|\w+)(\s*)`)

// maxTokenizeBytes bounds the text tokenized per request (the body is
// already bounded; this keeps a pathological prompt from costing more).
const maxTokenizeBytes = 1 << 20

// Tokenize implements Tokenizer.
func (SimTokenizer) Tokenize(_ string, text string) ([]uint32, bool) {
	if text == "" || len(text) > maxTokenizeBytes {
		return nil, false
	}
	words := simTokenRE.FindAllString(text, -1)
	out := make([]uint32, len(words))
	for i, w := range words {
		h := fnv.New32a()
		_, _ = h.Write([]byte(w))
		out[i] = h.Sum32()
	}
	return out, len(out) > 0
}
