package policies

// sloDeadline serves the request whose TTFT objective (arrival + SLO, from
// x-slo-ttft-ms) falls first. Requests without an objective go behind all
// requests with one, FCFS among themselves: as the seed warns, they can
// starve while SLO traffic keeps arriving.
type sloDeadline struct{}

func (sloDeadline) Name() string { return SLODeadline }

func (sloDeadline) Less(a, b *Item) bool { return deadlineLess(a, b, a.SLODeadline, b.SLODeadline) }
