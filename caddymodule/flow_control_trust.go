package caddymodule

import (
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluice-router/sluice/flow"
)

// The request headers flow control reads (the Gateway API Inference
// Extension's names). They are honoured only from trusted sources.
const (
	headerFairnessID = "X-Gateway-Inference-Fairness-Id"
	headerObjective  = "X-Gateway-Inference-Objective"
	headerSLOTTFT    = "X-Slo-Ttft-Ms"
)

// parsePrefix reads one trusted source: a CIDR range, or one address.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		return netip.ParsePrefix(s)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// maxSLOTTFT bounds x-slo-ttft-ms (a day): larger values overflow a
// duration and mean "no SLO" anyway.
const maxSLOTTFT = 24 * time.Hour

// trustedFlowHeaders reads the flow-control headers of a trusted request:
// tenant, priority (through the objectives) and SLO. A fairness id that
// cannot be a label is an error; an unparsable or absurd SLO is ignored.
func trustedFlowHeaders(hdr http.Header, objectives flow.Objectives) (flow.Request, error) {
	req := flow.Request{FlowID: hdr.Get(headerFairnessID)}
	if !flow.ValidFlowID(req.FlowID) {
		return req, fmt.Errorf("%s must be valid UTF-8 of at most %d bytes", headerFairnessID, flow.MaxLabelBytes)
	}
	req.Priority = objectives.Priority(hdr.Get(headerObjective))
	if ms, err := strconv.ParseFloat(hdr.Get(headerSLOTTFT), 64); err == nil && ms > 0 && ms <= float64(maxSLOTTFT/time.Millisecond) {
		req.SLOTTFT = time.Duration(ms * float64(time.Millisecond))
	}
	return req, nil
}

// isTrusted reports whether the request comes from a trusted source:
// its strict client IP (see clientIP) in one of TrustedSources.
func (h *FlowControl) isTrusted(r *http.Request) bool {
	if len(h.trusted) == 0 {
		return false
	}
	ip, ok := clientIP(r)
	if !ok {
		return false
	}
	for _, p := range h.trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// clientIP is the client as flow control trusts it. From a peer that is
// not one of the server's trusted_proxies, the peer itself. From a trusted
// proxy, Caddy's own client IP when the server parses strictly
// (trusted_proxies_strict); otherwise the right-most address of the
// client IP headers — what the trusted proxy saw connect to it — not the
// left-most one, which any client can write.
func clientIP(r *http.Request) (netip.Addr, bool) {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}, false
	}
	ip := peer.Addr().Unmap()
	ctx := r.Context()
	srv, _ := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if trusted, _ := caddyhttp.GetVar(ctx, caddyhttp.TrustedProxyVarKey).(bool); !trusted || srv == nil {
		return ip, true
	}
	if srv.TrustedProxiesStrict > 0 {
		if s, _ := caddyhttp.GetVar(ctx, caddyhttp.ClientIPVarKey).(string); s != "" {
			if a, err := netip.ParseAddr(s); err == nil {
				return a.Unmap(), true
			}
		}
		return ip, true
	}
	headers := srv.ClientIPHeaders
	if len(headers) == 0 {
		headers = []string{"X-Forwarded-For"}
	}
	for _, name := range headers {
		vals := r.Header.Values(name)
		if len(vals) == 0 {
			continue
		}
		last := vals[len(vals)-1]
		last = strings.TrimSpace(last[strings.LastIndex(last, ",")+1:])
		if a, err := netip.ParseAddr(last); err == nil {
			return a.Unmap(), true
		}
		return netip.Addr{}, false // a malformed header from a trusted proxy: trust nothing
	}
	return ip, true
}
