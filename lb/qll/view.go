package qll

import "time"

// The proxy's health view (Caddy's health checks and request limits)
// reaches a pick with each request (Request.Unavailable, Request.Full).
// A request that waits would otherwise see a replica come back only when
// a later request brought the news: with the adapter's view function the
// state reads it again when a request ends and, while requests wait with
// a replica flagged, every viewPollInterval.

// viewPollInterval is how often waiting requests look at the proxy's
// view while some replica is flagged: a health check's own period is
// seconds, so this adds little to the time a waiter takes to notice.
const viewPollInterval = 250 * time.Millisecond

// SetProxyView implements lb.ProxyViewer.
func (s *State) SetProxyView(view func() (unavailable, full []string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.view = view
	s.armViewPollLocked()
}

// viewMattersLocked: re-reading the view can change what waiting
// requests may do.
func (s *State) viewMattersLocked() bool {
	return s.view != nil && s.anyUnavailable && s.queue.Len() > 0 && !s.closed
}

// refreshViewLocked applies the proxy's view now, if it matters: a
// replica back gets the waiters, every replica down fails them.
func (s *State) refreshViewLocked() {
	if !s.viewMattersLocked() {
		return
	}
	s.markUnavailableLocked(s.view())
}

// armViewPollLocked schedules the next look at the view while it
// matters; the poll stops by itself once nothing waits or nothing is
// flagged.
func (s *State) armViewPollLocked() {
	if !s.viewMattersLocked() {
		return
	}
	if s.viewPollArmed {
		return
	}
	s.viewPollArmed = true
	if s.viewPoll == nil {
		s.viewPoll = time.AfterFunc(viewPollInterval, s.pollView)
		return
	}
	s.viewPoll.Reset(viewPollInterval)
}

func (s *State) pollView() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.viewPollArmed = false
	s.refreshViewLocked()
	s.armViewPollLocked()
}
