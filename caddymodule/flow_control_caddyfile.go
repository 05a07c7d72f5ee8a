package caddymodule

import (
	"fmt"
	"strconv"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// UnmarshalCaddyfile sets up the handler from:
//
//	flow_control [<pool>] {
//	    pool                  <name>
//	    trusted_sources       <cidr|ip>...
//	    objective             <name> <priority>      # repeatable
//	    max_requests          <n>
//	    max_bytes             <quantity>             # 10Gi, 512Mi, 1k, 1000
//	    default_ttl           <duration>
//	    band <priority> {                            # repeatable
//	        name         <name>
//	        max_requests <n>
//	        max_bytes    <quantity>
//	        fairness     round_robin|global_strict
//	        ordering     fcfs|edf|slo_deadline
//	        ttl          <duration>
//	    }
//	    detector              concurrency|utilization
//	    max_concurrency       <n per replica>
//	    concurrency_mode      requests|tokens
//	    max_token_concurrency <n per replica>
//	    headroom              <0..1>
//	    queue_depth_threshold <n>
//	    kv_cache_threshold    <0..1>
//	    metrics_staleness     <duration>
//	    metrics_interval      <duration>
//	    max_body_bytes        <bytes>
//	    replicas              <n>                    # default: the backend set, else the reverse_proxy's upstreams
//	    redis                 <host:port>...         # count in flight across instances (and the other Redis options)
//	    lease_ttl             <duration>
//	    fallback_share        <0..1>
//	}
func (h *FlowControl) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return parseModule(d, "flow_control", &h.Pool, h, func(opt string, vals []string) (bool, error) {
		switch opt {
		case "objective":
			if len(vals) != 2 {
				return true, fmt.Errorf("takes a name and a priority")
			}
			p, err := strconv.Atoi(vals[1])
			if err != nil {
				return true, fmt.Errorf("%s: bad priority %q", vals[0], vals[1])
			}
			if h.Objectives == nil {
				h.Objectives = map[string]int{}
			}
			h.Objectives[vals[0]] = p
		case "band":
			b, err := parseBand(d, vals)
			if err != nil {
				return true, err
			}
			h.Bands = append(h.Bands, b)
		default:
			return false, nil
		}
		return true, nil
	})
}

// parseBand parses `band <priority> { <option> <value> ... }`.
func parseBand(d *caddyfile.Dispenser, vals []string) (FlowBand, error) {
	if len(vals) != 1 {
		return FlowBand{}, fmt.Errorf("takes its priority, then a block")
	}
	p, err := strconv.Atoi(vals[0])
	if err != nil {
		return FlowBand{}, fmt.Errorf("bad priority %q", vals[0])
	}
	b := FlowBand{Priority: p}
	for nest := d.Nesting(); d.NextBlock(nest); {
		opt := d.Val()
		if err := setOption(&b, opt, d.RemainingArgs()); err != nil {
			return b, fmt.Errorf("%d: %s: %v", p, opt, err)
		}
	}
	return b, nil
}
