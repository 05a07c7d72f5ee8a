package caddymodule

import (
	"sync/atomic"

	"go.uber.org/zap"
)

// stateLog is the logger of a pool's kept state: the latest started
// config's. A state outlives reloads, and a logger taken when it was
// built kept the first config's logging (its level; its writer, closed
// once that config stopped), so a reload that moved the log or turned on
// debug never showed the state's own lines.
type stateLog struct{ p atomic.Pointer[zap.Logger] }

func newStateLog(l *zap.Logger) *stateLog {
	s := new(stateLog)
	s.p.Store(l)
	return s
}

// set makes l the state's logger (a starting config's apply).
func (s *stateLog) set(l *zap.Logger) { s.p.Store(l) }

func (s *stateLog) get() *zap.Logger { return s.p.Load() }
