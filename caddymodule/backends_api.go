package caddymodule

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb"
)

// The backend-set and health operations, shared by the custom_router
// handler (on the listener port, as the HF platform calls it) and the
// admin API module.

// maxAPIBody bounds set-backends bodies: thousands of URLs fit.
const maxAPIBody = 1 << 20

type setBackendsRequest struct {
	Backends *[]string `json:"backends"`
}

// readSetBackends decodes and validates a set-backends body; the error
// message is what the client gets with 400.
// allowed (if not nil) further restricts each backend.
func readSetBackends(w http.ResponseWriter, r *http.Request, allowed func(lb.Backend) error) ([]lb.Backend, int, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAPIBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("body larger than %d bytes", maxAPIBody)
		}
		return nil, http.StatusBadRequest, fmt.Errorf("reading body: %v", err)
	}
	var req setBackendsRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("body must be JSON {\"backends\": [\"http://host:port\", ...]}: %v", err)
	}
	// Not dec.More(): it reports false for a stray ']' or '}', which then
	// passed as the end of the body.
	if len(bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n")) > 0 {
		return nil, http.StatusBadRequest, errors.New("trailing data after the JSON object")
	}
	if req.Backends == nil {
		return nil, http.StatusBadRequest, errors.New(`missing "backends" (use [] for no backends)`)
	}
	bs, err := lb.ParseBackends(*req.Backends)
	if err != nil {
		return nil, http.StatusBadRequest, err
	}
	for i, b := range bs {
		err := refuseOwnAddress(b, r)
		if err := clientStayed(r); err != nil {
			return nil, http.StatusBadRequest, err
		}
		if err == nil && allowed != nil {
			err = allowed(b)
		}
		if err != nil {
			return nil, http.StatusBadRequest, fmt.Errorf("backends[%d]: %w", i, err)
		}
	}
	return bs, http.StatusOK, nil
}

// clientStayed is an error once the call's client has gone: the own-address
// checks resolve names under the call's context, and a lookup cut short
// finds no address, which passes. A set checked so is not applied.
func clientStayed(r *http.Request) error {
	if err := r.Context().Err(); err != nil {
		return fmt.Errorf("the client left before the backends were checked (%v); nothing changed", err)
	}
	return nil
}

// applyBackends makes bs the pool's set, persists it and logs the change.
//
// Every change of a set goes through setsMu, held across the change and
// its file write: two changes (a set-backends racing an add_worker) must
// not leave the file with the older set, nor an add_worker's
// read-modify-write lose a set-backends.
func applyBackends(name string, bs []lb.Backend, log *zap.Logger) (added, removed []string) {
	setsMu.Lock()
	defer setsMu.Unlock()
	return applyBackendsLocked(name, bs, log)
}

var setsMu sync.Mutex

func applyBackendsLocked(name string, bs []lb.Backend, log *zap.Logger) (added, removed []string) {
	added, removed = lb.GetPool(name).Set(bs)
	persistPool(name, bs, log)
	log.Info("backend set replaced", zap.String("pool", name), zap.Int("backends", len(bs)),
		zap.Strings("added", added), zap.Strings("removed", removed))
	return added, removed
}

func serveSetBackends(w http.ResponseWriter, r *http.Request, name string, allowed func(lb.Backend) error, log *zap.Logger) {
	serveSetBackendsTo(w, r, name, allowed, nil, log)
}

// serveSetBackendsTo is serveSetBackends that calls prepare (if not nil)
// once the call is accepted, before the set changes: the admin API
// restores a pool it may not have yet only then, so a refused call leaves
// no pool behind.
func serveSetBackendsTo(w http.ResponseWriter, r *http.Request, name string, allowed func(lb.Backend) error, prepare func(), log *zap.Logger) {
	if r.Method != http.MethodPost && r.Method != http.MethodPut {
		w.Header().Set("Allow", "POST, PUT")
		writeJSONError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use POST")
		return
	}
	bs, status, err := readSetBackends(w, r, allowed)
	if err != nil {
		log.Warn("set-backends rejected; previous set kept", zap.String("pool", name), zap.Error(err))
		writeJSONError(w, status, "invalid_request", err.Error())
		return
	}
	if prepare != nil {
		prepare()
	}
	added, removed := applyBackends(name, bs, log)
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "pool": name, "backends": urls(bs),
		"added": nonNil(added), "removed": nonNil(removed)})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	// Encoded before the status goes out: a value that cannot be encoded
	// (a Sluice bug) answers 500 saying why, not 200 with an empty body.
	b, err := json.Marshal(v)
	if err != nil {
		writeJSONError(w, http.StatusInternalServerError, "internal", "encoding the answer: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func urls(bs []lb.Backend) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.URL
	}
	return out
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
