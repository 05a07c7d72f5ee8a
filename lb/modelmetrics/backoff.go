package modelmetrics

import "time"

// outcome is a target's latest scrape: its sample and the back-off it set.
// Why back off: a replica that exports no metrics (a diffusion server, a
// simulated replica without them) answers 404 forever, and a scrape every
// Interval only fills its log.
type outcome struct {
	smp   Sample
	fails int       // consecutive failed scrapes; 0 after a success
	due   time.Time // no round scrapes the target before then; zero after a success (but see Config.Settled)
	// tlsGen is the scraper's TLS generation when the last failure was
	// met: one met under an earlier TLS config (an untrusted certificate
	// before a reload named the CA) says nothing of the replica now.
	tlsGen uint64
}

// failedUnderOldTLS reports whether the target backs off for failures met
// under a TLS config older than generation gen: it is due at once.
func (o *outcome) failedUnderOldTLS(gen uint64) bool {
	return o != nil && o.fails > 0 && o.tlsGen != gen
}

// recoveringBackoff caps, in Intervals, the back-off of a target that
// exported metrics before: a replica restarting should be read again soon
// after it is back (the long back-off is for one that never exports them).
const recoveringBackoff = 4

// backoff is the wait after fails (at least 1) consecutive failures:
// Interval, doubled per further failure, at most maxWait.
func backoff(interval, maxWait time.Duration, fails int) time.Duration {
	d := interval
	for i := 1; i < fails && d < maxWait; i++ {
		d *= 2
	}
	return min(d, maxWait)
}

// dueAt reports whether a round at now may scrape the target (o nil: never
// scraped). Half an Interval early counts: a tick may read the clock a
// little less than an Interval after the round that set due, and must not
// lose a whole Interval for it.
func (o *outcome) dueAt(now time.Time, interval time.Duration) bool {
	return o == nil || o.due.IsZero() || !now.Before(o.due.Add(-interval/2))
}
