package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/redistest"
)

// flow_control { redis … } with a Redis user that lacks a command the
// gate needs (here TIME) is refused when the config loads, naming
// flow_control and the command; the running config keeps serving. The
// gate used to start anyway and serve on its fallback share for good.
func TestFlowControlRedisUserLackingACommandRefusesTheConfig(t *testing.T) {
	addr := testRedis(t)
	admin := redistest.Client(t, redisconn.Config{Addrs: []string{addr}})
	user := fmt.Sprint("sluice-flow-", time.Now().UnixNano())
	if err := admin.Do(context.Background(), admin.B().AclSetuser().Username(user).
		Rule("on", ">pw", "~*", "&*", "+@all", "-time").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	startCaddy(t, globals+`
:9874 {
	bind 127.0.0.1
	respond "up"
}
`)
	site := globals + fmt.Sprintf(`
:9874 {
	bind 127.0.0.1
	flow_control fga {
		max_concurrency 1
		redis %s
		username %s
		password pw
	}
	reverse_proxy 127.0.0.1:9875
}
`, addr, user)
	status, body := load(t, adapt(t, site))
	if status == 200 || !strings.Contains(body, "flow_control") || !strings.Contains(body, "TIME") {
		t.Fatalf("load answered %d %s; want a refusal naming flow_control and TIME", status, body)
	}
	resp, err := client.Get("http://127.0.0.1:9874/")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the running config changed: %v %v", resp, err)
	}
	resp.Body.Close()
}
