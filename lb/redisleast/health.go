package redisleast

import "github.com/sluice-router/sluice/lb/tracker"

// ReplicaHealth is this instance's passive health of each replica, for
// health reports: its own leases in flight, whether failures have it
// down, its failures so far, and the replicas removed from the set whose
// leases still run (Present false; see tracker.Tracker.Snapshot). A lease
// on a replica outside the set it was given is not counted here.
func (s *Store) ReplicaHealth() []tracker.ReplicaStats { return s.health.Snapshot() }
