package policies

import "time"

// edf serves the request whose queue deadline (arrival + TTL) comes first,
// so a request with a short TTL is tried before it would expire. An item
// without a deadline goes behind every item with one; ties are FCFS.
type edf struct{}

func (edf) Name() string { return EDF }

func (edf) Less(a, b *Item) bool { return deadlineLess(a, b, a.Deadline, b.Deadline) }

// deadlineLess orders by deadline (ad, bd), zero deadlines last, then by Seq.
func deadlineLess(a, b *Item, ad, bd time.Time) bool {
	aNone, bNone := ad.IsZero(), bd.IsZero()
	switch {
	case aNone != bNone:
		return bNone
	case !aNone && !ad.Equal(bd):
		return ad.Before(bd)
	}
	return a.Seq < b.Seq
}
