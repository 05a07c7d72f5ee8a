package reqtext

import "testing"

// vLLM's cache_salt is read (the KV index keys a salted request's blocks
// apart); one that is not a string is left to the engine to refuse, the
// body still parsed.
func TestReviewS34CacheSalt(t *testing.T) {
	cases := []struct {
		path, body, want string
	}{
		{"/v1/completions", `{"model":"m","prompt":"hi","cache_salt":"tenant-\u0061"}`, "tenant-a"},
		{"/v1/chat/completions", `{"cache_salt":"s1","model":"m","messages":[{"role":"user","content":"hi"}]}`, "s1"},
		{"/v1/completions", `{"model":"m","prompt":"hi","cache_salt":null}`, ""},
		{"/v1/completions", `{"model":"m","prompt":"hi","cache_salt":{"x":[1]}}`, ""},
		{"/v1/completions", `{"model":"m","prompt":"hi","cache_salt":"a","cache_salt":7}`, ""},
		{"/v1/completions", `{"model":"m","prompt":"hi"}`, ""},
	}
	for _, c := range cases {
		req, err := Extract(c.path, []byte(c.body))
		if err != nil || req.CacheSalt != c.want || req.Text == "" {
			t.Errorf("%s: salt %q, text %q, err %v; want salt %q", c.body, req.CacheSalt, req.Text, err, c.want)
		}
	}
}
