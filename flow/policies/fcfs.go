package policies

// fcfs serves requests in arrival order. Seq, not Arrival, decides: two
// requests can share a clock reading, never a sequence number.
type fcfs struct{}

func (fcfs) Name() string { return FCFS }

func (fcfs) Less(a, b *Item) bool { return a.Seq < b.Seq }
