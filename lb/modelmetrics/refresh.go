package modelmetrics

// Refresh asks a running Run for a round of every target now rather than
// at the next Interval: for a caller holding requests on what the last
// samples said. Rounds come at most every Config.MinRefresh; a Refresh
// within it is served when it has passed, and Refreshes meanwhile are
// merged into that one. A target backing off after failed scrapes is
// left alone until its wait has passed. It never waits for a scrape.
func (s *Scraper) Refresh() {
	s.refreshMu.Lock()
	s.refreshAll = true
	s.refreshMu.Unlock()
	s.askRound()
}

// RefreshTargets is Refresh for the targets at addrs only (none: nothing).
// The addresses asked for between two rounds are merged into the next.
func (s *Scraper) RefreshTargets(addrs ...string) {
	if len(addrs) == 0 {
		return
	}
	s.refreshMu.Lock()
	for _, a := range addrs {
		s.refreshSet[a] = struct{}{}
	}
	s.refreshMu.Unlock()
	s.askRound()
}

func (s *Scraper) askRound() {
	select {
	case s.refresh <- struct{}{}:
	default: // one is pending
	}
}

// takeRefresh hands Run what was asked for since the last refresh round
// (all: every target) and collects the next requests in spare, which must
// be empty.
func (s *Scraper) takeRefresh(spare map[string]struct{}) (all bool, want map[string]struct{}) {
	s.refreshMu.Lock()
	defer s.refreshMu.Unlock()
	all, want = s.refreshAll, s.refreshSet
	s.refreshAll, s.refreshSet = false, spare
	return all, want
}
